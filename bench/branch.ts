/**
 * BRANCH benchmark: every figure measured in this one run, against a real daemon (its own
 * process, a throwaway data dir) over the REST API. Prints a table and JSON.
 *
 *   node dist/bench/branch.js [--samples 5] [--dirty 8,64,256] [--memory-mib 1024] [--depth 8] [--no-pack] [--json-out FILE]
 *
 * - pause p50/p90 of the source against how much it wrote since its fork (its dirty set), on a
 *   guest of --memory-mib; the total time until the snapshot is ready;
 * - fork from a branch: first fork (verifies it) and later ones;
 * - spawn time against chain depth 0..--depth (0: the base; a branch of a child of a branch of
 *   ...), first and later spawns of each tag, until ready and until the first exec answers; the
 *   host disk each branch added (its snapshot's physical bytes) and its time until forkable;
 * - pack of the deepest chain (time, size), and its restore: unpack into a second daemon with an
 *   empty data dir and image cache, then its first and later forks there.
 */
import { createReadStream, createWriteStream } from "node:fs";
import { mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import { checkResponse, rawRequest, readAll } from "../test/helpers/http.js";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { startDaemon } from "./daemon.js";
import { forkOne, kill as killSandbox } from "./ops.js";
import { pct, r1 } from "./stats.js";

const { values: args } = parseArgs({
  options: {
    samples: { type: "string", default: "5" },
    dirty: { type: "string", default: "8,64,256" },
    "memory-mib": { type: "string", default: "1024" },
    depth: { type: "string", default: "8" },
    "no-pack": { type: "boolean", default: false },
    "json-out": { type: "string" },
  },
});
const SAMPLES = Number(args.samples);
const DIRTY = args.dirty
  .split(",")
  .map(Number)
  .filter((n) => n > 0);
const MEMORY = Number(args["memory-mib"]);
const DEPTH = Number(args.depth);

const log = (s: string) => process.stderr.write(s + "\n");

interface BranchOut {
  tag: string;
  pause_ms: number;
  private_bytes: number;
}

async function main(): Promise<void> {
  const dataDir = await mkdtemp(join(tmpdir(), "forkd-bench-branch-"));
  let daemon = await startDaemon(dataDir, { FORKD_POOL_SIZE: "0" });
  let restoreDir: string | null = null;
  const api = <T>(m: string, p: string, b?: unknown) => daemon.api<T>(m, p, b);
  const fork = (tag: string) => forkOne(api, tag);
  const kill = (id: string) => killSandbox(api, id);
  const py = (id: string, code: string) =>
    api<{ ok: boolean; error: unknown }>("POST", `/v1/sandboxes/${id}/eval`, { code, timeout_ms: 1_200_000 });
  try {
    const health = await api<{ accel: string; accel_reason: string }>("GET", "/v1/health");
    log(`accelerator: ${health.accel} (${health.accel_reason})`);
    log(`snapshot: ${MEMORY} MiB guest`);
    await api("POST", "/v1/snapshots", { tag: "base", memory_mib: MEMORY, warm_eval: "import os" });

    // Pause against the dirty set.
    const pause: Record<string, { p50: number; p90: number; totalP50: number; privateMiB: number }> = {};
    let lastBranch = "";
    for (const mib of DIRTY) {
      const src = await fork("base");
      log(`dirty ${mib} MiB: writing it in the guest`);
      const w = await py(src.id, `blob = os.urandom(${mib} << 20)`);
      if (!w.ok) throw new Error(`could not dirty ${mib} MiB: ${JSON.stringify(w.error)}`);
      const pauses: number[] = [];
      const totals: number[] = [];
      let priv = 0;
      for (let i = 0; i < SAMPLES; i++) {
        const t0 = performance.now();
        const b = await api<BranchOut>("POST", `/v1/sandboxes/${src.id}/branch`, { tag: `d${mib}-${i}` });
        totals.push(performance.now() - t0);
        pauses.push(b.pause_ms);
        priv = b.private_bytes;
        if (i < SAMPLES - 1 || mib !== DIRTY[DIRTY.length - 1])
          await api("DELETE", `/v1/snapshots/d${mib}-${i}`);
        else lastBranch = b.tag;
      }
      pause[String(mib)] = {
        p50: r1(pct(pauses, 50)),
        p90: r1(pct(pauses, 90)),
        totalP50: r1(pct(totals, 50)),
        privateMiB: r1(priv / 2 ** 20),
      };
      log(`  pause p50 ${pause[String(mib)]?.p50} ms, private ${pause[String(mib)]?.privateMiB} MiB`);
      await kill(src.id);
    }

    // Fork from a branch.
    const first = await fork(lastBranch);
    await kill(first.id);
    const later: number[] = [];
    for (let i = 0; i < SAMPLES; i++) {
      const f = await fork(lastBranch);
      later.push(f.ms);
      await kill(f.id);
    }
    await api("DELETE", `/v1/snapshots/${lastBranch}`);

    // Spawn time against chain depth.
    const chain: Array<{ depth: number; firstMs: number; laterP50: number; execP50: number }> = [];
    const branches: Array<{ depth: number; readyMs: number; newDiskMiB: number }> = [];
    let tag = "base";
    const tags: string[] = [];
    for (let depth = 1; depth <= DEPTH; depth++) {
      const c = await fork(tag);
      await py(c.id, `layer_${depth} = bytearray(os.urandom(1 << 20))`);
      const t0 = performance.now();
      const b = await api<BranchOut>("POST", `/v1/sandboxes/${c.id}/branch`, { tag: `depth${depth}` });
      const readyMs = performance.now() - t0;
      await kill(c.id);
      tag = b.tag;
      tags.push(tag);
      const info = await api<{ physical_bytes: number }>("GET", `/v1/snapshots/${tag}/info`);
      branches.push({ depth, readyMs: r1(readyMs), newDiskMiB: r1(info.physical_bytes / 2 ** 20) });
    }
    // Restart the daemon so every tag's first spawn verifies it from scratch.
    await daemon.stop();
    daemon = await startDaemon(dataDir, { FORKD_POOL_SIZE: "0" });
    for (const [i, t] of ["base", ...tags].entries()) {
      const f1 = await fork(t);
      await kill(f1.id);
      const ms: number[] = [];
      const exec: number[] = [];
      for (let k = 0; k < 3; k++) {
        const f = await fork(t);
        ms.push(f.ms);
        const t1 = performance.now();
        await api("POST", `/v1/sandboxes/${f.id}/exec`, { cmd: "true" });
        exec.push(f.ms + performance.now() - t1);
        await kill(f.id);
      }
      chain.push({ depth: i, firstMs: r1(f1.ms), laterP50: r1(pct(ms, 50)), execP50: r1(pct(exec, 50)) });
      log(
        `  depth ${i}: first ${r1(f1.ms)} ms, later p50 ${r1(pct(ms, 50))} ms, to first exec ${r1(pct(exec, 50))} ms`,
      );
    }
    const readyP50 = r1(
      pct(
        branches.map((b) => b.readyMs),
        50,
      ),
    );
    const diskP50 = r1(
      pct(
        branches.map((b) => b.newDiskMiB),
        50,
      ),
    );
    log(`  chain branches: until forkable p50 ${readyP50} ms, new disk p50 ${diskP50} MiB`);

    let packRes = { ms: NaN, mib: NaN, logical: NaN, unpackMs: NaN, first: NaN, laterP50: NaN };
    const last = tags[tags.length - 1] ?? "base";
    if (!args["no-pack"]) {
      // Pack the deepest tag (its whole chain and the guest image).
      const packFile = join(dataDir, "bench.pack");
      const tp = performance.now();
      const res = await checkResponse(
        await rawRequest(daemon.ep, "GET", `/v1/snapshots/${last}/pack`, undefined, 0),
      );
      await pipeline(res, createWriteStream(packFile));
      const packMs = performance.now() - tp;
      const packMiB = (await stat(packFile)).size / 2 ** 20;
      const logical = (await api<{ logical_bytes: number }>("GET", `/v1/snapshots/${last}/info`))
        .logical_bytes;
      log(`  pack of depth ${tags.length}: ${r1(packMs)} ms, ${r1(packMiB)} MiB`);

      // Restore it on a "new host": a second daemon, empty data dir and image cache.
      await daemon.stop();
      restoreDir = await mkdtemp(join(tmpdir(), "forkd-bench-restore-"));
      daemon = await startDaemon(restoreDir, {
        FORKD_POOL_SIZE: "0",
        FORKD_CACHE_DIR: join(restoreDir, "cache"),
      });
      const tu = performance.now();
      await readAll(
        await checkResponse(
          await rawRequest(daemon.ep, "POST", "/v1/snapshots/unpack", createReadStream(packFile), 0, {
            "content-type": "application/octet-stream",
          }),
        ),
      );
      const unpackMs = performance.now() - tu;
      const restored1 = await fork(last);
      await kill(restored1.id);
      const restoredLater: number[] = [];
      for (let k = 0; k < 3; k++) {
        const f = await fork(last);
        restoredLater.push(f.ms);
        await kill(f.id);
      }
      log(`  unpack: ${r1(unpackMs)} ms; first fork ${r1(restored1.ms)} ms`);

      packRes = {
        ms: packMs,
        mib: packMiB,
        logical,
        unpackMs,
        first: restored1.ms,
        laterP50: pct(restoredLater, 50),
      };
    }
    const result = {
      date: new Date().toISOString(),
      accel: health.accel,
      memoryMiB: MEMORY,
      samples: SAMPLES,
      pauseByDirtyMiB: pause,
      forkFromBranchMs: { first: r1(first.ms), laterP50: r1(pct(later, 50)) },
      spawnByChainDepth: chain,
      chainBranches: { each: branches, untilForkableP50: readyP50, newDiskMiBP50: diskP50 },
      pack: {
        depth: tags.length,
        ms: r1(packRes.ms),
        mib: r1(packRes.mib),
        logicalMiBPerSnapshot: r1(packRes.logical / 2 ** 20),
      },
      restore: {
        unpackMs: r1(packRes.unpackMs),
        firstForkMs: r1(packRes.first),
        laterForkP50: r1(packRes.laterP50),
      },
    };
    console.log("\n| measure | result |\n|---|---|");
    for (const [mib, p] of Object.entries(pause)) {
      console.log(
        `| pause with ${mib} MiB dirty (${p.privateMiB} MiB private), p50 / p90 | ${p.p50} / ${p.p90} ms |`,
      );
      console.log(`| branch until ready (${mib} MiB dirty), p50 | ${p.totalP50} ms |`);
    }
    console.log(
      `| fork from a branch: first / later p50 | ${result.forkFromBranchMs.first} / ${result.forkFromBranchMs.laterP50} ms |`,
    );
    console.log(
      `| pack of a depth-${tags.length} chain (${tags.length + 1} snapshots of ${MEMORY} MiB + image): time / size | ${result.pack.ms} ms / ${result.pack.mib} MiB |`,
    );
    console.log(
      `| restore that pack on an empty host (unpack; image installed, checksums verified) | ${result.restore.unpackMs} ms |`,
    );
    console.log(
      `| fork from the restored chain: first / later p50 | ${result.restore.firstForkMs} / ${result.restore.laterForkP50} ms |`,
    );
    for (const c of chain)
      console.log(
        `| spawn at chain depth ${c.depth}: first / later p50 / to first exec p50 | ${c.firstMs} / ${c.laterP50} / ${c.execP50} ms |`,
      );
    console.log(`| chain branch (1 MiB written) until forkable, p50 | ${readyP50} ms |`);
    console.log(`| new host disk per chain branch, p50 | ${diskP50} MiB |`);
    console.log("\n" + JSON.stringify(result));
    if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(result, null, 2) + "\n");
  } finally {
    await daemon.stop();
    await rm(dataDir, { recursive: true, force: true }).catch(() => undefined);
    if (restoreDir) await rm(restoreDir, { recursive: true, force: true }).catch(() => undefined);
  }
}

main().catch((e: unknown) => {
  log(`bench failed: ${e instanceof Error ? e.stack : String(e)}`);
  process.exit(1);
});
