/**
 * Fork latency by network mode: one snapshot, then `--samples` sequential forks per mode, each
 * timed from the client (POST to reply: the child's agent has answered, its link is up and its
 * exposed ports relay) and by the daemon (timings.total_ms), killed before the next.
 *
 *   node dist/bench/net.js [--samples 15] [--modes none,user-deny,user-allow,netns] [--pool 2]
 *                          [--json-out FILE]
 *
 * `user-allow` runs in a netns slot (see src/net/service.ts). Modes other than `none` never use
 * the pool of pre-started VMMs; run with --pool 0 to compare like with like.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { instanceId, instanceOf } from "../src/net/slots.js";
import { teardownInstance } from "../src/net/pool.js";
import { nowMs, since } from "../src/util/time.js";
import { startDaemon } from "./daemon.js";
import { pct, r1 } from "./stats.js";

const { values: args } = parseArgs({
  options: {
    samples: { type: "string", default: "15" },
    modes: { type: "string", default: "none,user-deny,user-allow,netns" },
    pool: { type: "string", default: "2" },
    "json-out": { type: "string" },
  },
});

const NETWORKS: Record<string, unknown> = {
  none: undefined,
  "user-deny": { mode: "user", egress: { mode: "deny" } },
  "user-allow": { mode: "user", egress: { mode: "allow" } },
  netns: { mode: "netns", egress: { mode: "allow" } },
  "netns-expose": { mode: "netns", egress: { mode: "deny" }, expose: [8000] },
};

const log = (s: string) => process.stderr.write(s + "\n");

interface ForkReply {
  sandboxes: Array<{
    id: string;
    from_pool: boolean;
    timings: { launch_ms: number; restore_ms: number; ready_ms: number; total_ms: number };
  }>;
  failures: Array<{ message: string }>;
}

async function main(): Promise<void> {
  const samples = Number(args.samples);
  const modes = args.modes.split(",").filter((m) => m in NETWORKS);
  const dataDir = await mkdtemp(join(tmpdir(), "forkd-bench-net-"));
  const d = await startDaemon(dataDir, { FORKD_POOL_SIZE: args.pool, FORKD_NET_SLOTS: "4" });
  const results: Record<string, unknown> = {};
  try {
    log("snapshot: booting a parent");
    await d.api("POST", "/v1/snapshots", { tag: "bench-net", memory_mib: 512 });
    for (const mode of modes) {
      const client: number[] = [];
      const daemon: number[] = [];
      const launch: number[] = [];
      const ready: number[] = [];
      let pooled = 0;
      for (let i = 0; i < samples + 1; i++) {
        const t0 = nowMs();
        const r = await d.api<ForkReply>("POST", "/v1/sandboxes", {
          snapshot_tag: "bench-net",
          network: NETWORKS[mode],
        });
        const ms = since(t0);
        const sb = r.sandboxes[0];
        if (!sb) throw new Error(`${mode}: fork failed: ${r.failures[0]?.message}`);
        // The first fork of each mode warms caches (and the pool): not counted.
        if (i > 0) {
          client.push(ms);
          daemon.push(sb.timings.total_ms);
          launch.push(sb.timings.launch_ms);
          ready.push(sb.timings.ready_ms);
          if (sb.from_pool) pooled++;
        }
        await d.api("DELETE", `/v1/sandboxes/${sb.id}`);
        // Let the slot recycle and the pool refill off the measured path.
        await new Promise((r) => setTimeout(r, 500));
      }
      results[mode] = {
        samples,
        from_pool: pooled,
        client_p50_ms: r1(pct(client, 50)),
        client_p90_ms: r1(pct(client, 90)),
        daemon_total_p50_ms: r1(pct(daemon, 50)),
        daemon_total_p90_ms: r1(pct(daemon, 90)),
        // launch: slot and policy, QEMU started, sockets connected (a pooled VMM: hand-over only);
        // ready: restore, link, resume, the agent's reply (with carrier), relays listening.
        launch_p50_ms: r1(pct(launch, 50)),
        ready_p50_ms: r1(pct(ready, 50)),
      };
      log(`${mode}: ${JSON.stringify(results[mode])}`);
    }
  } finally {
    await d.stop();
    await teardownInstance(instanceOf(instanceId(dataDir), 64)).catch(() => undefined);
    await rm(dataDir, { recursive: true, force: true });
  }
  const out = { date: new Date().toISOString(), pool: Number(args.pool), results };
  console.log(JSON.stringify(out, null, 2));
  if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(out, null, 2) + "\n");
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
