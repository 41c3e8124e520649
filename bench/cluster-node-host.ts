/**
 * A process of the scale benchmark holding several cluster nodes (bench/cluster-fake-node.ts),
 * as a machine holds one: `node dist/bench/cluster-node-host.js JSON` with the nodes to run.
 * Prints one line of JSON when every node has joined and serves (`{"ready":[{id,api}]}`), or
 * `{"error":...}`; then runs until SIGTERM or until its stdin closes (the bench is gone), when
 * it stops its nodes as a daemon stops (sandboxes killed, leases revoked). The bench kills one
 * such process with SIGKILL to measure how soon the cluster marks its node's sandboxes lost.
 */
import { appendFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { startBenchNode } from "./cluster-fake-node.js";
import type { BenchNode } from "./cluster-fake-node.js";

const Spec = z.object({
  cluster: z.string(),
  prefix: z.string(),
  adminToken: z.string(),
  maxSandboxes: z.number().int().positive(),
  /** The nodes' settings (FORKD_RATE_RPS ...). */
  env: z.record(z.string(), z.string()).default({}),
  /** The parent of the nodes' data directories (each node: <dir>/<id>). */
  dir: z.string(),
  ids: z.array(z.string()).min(1),
  /** Nodes joining at once. */
  parallel: z.number().int().positive().default(4),
});

async function main(): Promise<void> {
  const spec = Spec.parse(JSON.parse(process.argv[2] ?? "null"));
  const logFile = join(spec.dir, `host-${spec.ids[0] ?? "x"}.log`);
  const write = (level: string) => (msg: string, f?: Record<string, unknown>) =>
    appendFileSync(logFile, JSON.stringify({ t: new Date().toISOString(), level, msg, ...f }) + "\n");
  const log = { info: write("info"), warn: write("warn") };
  const nodes: BenchNode[] = [];
  let stopping: Promise<void> | null = null;
  const stop = () =>
    (stopping ??= (async () => {
      await Promise.all(nodes.map((n) => n.close().catch(() => undefined)));
      process.exit(0);
    })());
  process.on("SIGTERM", () => void stop());
  process.stdin.on("end", () => void stop());
  process.stdin.on("error", () => void stop());
  process.stdin.resume();
  const queue = [...spec.ids];
  await Promise.all(
    Array.from({ length: Math.min(spec.parallel, queue.length) }, async () => {
      for (let id = queue.shift(); id !== undefined; id = queue.shift()) {
        nodes.push(
          await startBenchNode({
            id,
            dir: join(spec.dir, id),
            cluster: spec.cluster,
            prefix: spec.prefix,
            adminToken: spec.adminToken,
            maxSandboxes: spec.maxSandboxes,
            env: spec.env,
            log: {
              info: (m, f) => log.info(m, { node: id, ...f }),
              warn: (m, f) => log.warn(m, { node: id, ...f }),
            },
          }),
        );
      }
    }),
  );
  process.stdout.write(JSON.stringify({ ready: nodes.map((n) => ({ id: n.id, api: n.api })) }) + "\n");
}

main().catch((e: unknown) => {
  process.stdout.write(
    JSON.stringify({ error: e instanceof Error ? (e.stack ?? e.message) : String(e) }) + "\n",
  );
  process.exit(1);
});
