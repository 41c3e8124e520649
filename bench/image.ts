/**
 * Image benchmark (issue 13): every figure with its baseline measured in this one run, medians of
 * the samples. The Debian test image (test/helpers/oci-images.ts pushDebianImage: the python
 * template's debootstrap tree as one zstd layer, so image and template have the same userland)
 * is pushed to a loopback docker-registry, then:
 *   1. pull + flatten throughput, no VM (bench/pull-measure.ts: cold pulls into empty caches);
 *   2. snapshot creation from the cached image vs from the cached python template, same memory
 *      and warm-up, both fully cached (a warm-up creation of each first, unmeasured: it pulls the
 *      image and builds its guest image), interleaved samples;
 *   3. fork → agent ready and → first exec reply from an image snapshot vs a template snapshot,
 *      interleaved, each fork taken with both warm pools full.
 * Against a real daemon (its own process, a throwaway data dir, FORKD_POOL_SIZE=--pool) over REST.
 *
 *   node dist/bench/image.js [--pull-samples 3] [--samples 3] [--forks 10] [--pool 2]
 *                            [--memory-mib 512] [--json-out FILE]
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { rawRequest } from "../test/helpers/http.js";
import { pushDebianImage } from "../test/helpers/oci-images.js";
import { startRegistry } from "../test/helpers/registry.js";
import type { TestRegistry } from "../test/helpers/registry.js";
import { pidsReferencing } from "../src/util/proc.js";
import { startDaemon } from "./daemon.js";
import type { BenchDaemon } from "./daemon.js";
import { measurePull, pullTable } from "./pull-measure.js";

const { values: args } = parseArgs({
  options: {
    "pull-samples": { type: "string", default: "3" },
    samples: { type: "string", default: "3" },
    forks: { type: "string", default: "10" },
    pool: { type: "string", default: "2" },
    "memory-mib": { type: "string", default: "512" },
    "json-out": { type: "string" },
  },
});
const PULL_SAMPLES = Number(args["pull-samples"]);
const SAMPLES = Number(args.samples);
const FORKS = Number(args.forks);
const POOL = Number(args.pool);
const MEMORY_MIB = Number(args["memory-mib"]);
const WARM_EVAL = "import numpy as np\nwarm = np.arange(10)";

/** The median (of an even count: the mean of the middle two). */
const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length === 0 ? NaN : s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const r1 = (x: number) => Math.round(x * 10) / 10;
const r2 = (x: number) => Math.round(x * 100) / 100;
const log = (s: string) => process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${s}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The build stages a creation's progress says were built, not found cached (the agent's make always runs). */
const builtStages = (messages: string[]) =>
  messages.filter((m) => m.startsWith("DONE ") && !m.startsWith("DONE agent ") && !m.endsWith(" cached"));

type Kind = "image" | "template";
const KINDS: Kind[] = ["image", "template"];
/** Sample i runs the kinds in this order: alternating, so neither always goes first. */
const order = (i: number): Kind[] => (i % 2 === 0 ? KINDS : [...KINDS].reverse());

interface SnapshotView {
  tag: string;
  source: Record<string, unknown>;
  image: { dir: string };
  timings: { boot_ms: number; warm_ms: number; freeze_ms: number };
}

interface Creation {
  wallMs: number;
  /** Request to the first boot progress line: the image (pull check, guest image lookup). */
  prepareMs: number;
  bootMs: number;
  warmMs: number;
  freezeMs: number;
  /** The rest: checksums of the frozen files, meta, publish. */
  finishMs: number;
  messages: string[];
  snapshot: SnapshotView;
}

/** POST /v1/snapshots?stream=1, the time of each phase's first progress line kept. */
async function createStreamed(d: BenchDaemon, body: Record<string, unknown>): Promise<Creation> {
  const t0 = performance.now();
  const res = await rawRequest(d.ep, "POST", "/v1/snapshots?stream=1", JSON.stringify(body), 1_800_000, {
    "content-type": "application/json",
  });
  const firstAt = new Map<string, number>();
  const messages: string[] = [];
  let last: Record<string, unknown> = {};
  let buf = "";
  for await (const chunk of res) {
    buf += (chunk as Buffer).toString("utf8");
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line) continue;
      const ev = JSON.parse(line) as Record<string, unknown>;
      last = ev;
      if (ev.type === "progress") {
        messages.push(String(ev.message));
        const phase = typeof ev.phase === "string" ? ev.phase : "";
        if (phase && !firstAt.has(phase)) firstAt.set(phase, performance.now() - t0);
      }
    }
  }
  const wallMs = performance.now() - t0;
  if (last.type !== "done") throw new Error(`snapshot ${String(body.tag)} failed: ${JSON.stringify(last)}`);
  const snapshot = last.snapshot as SnapshotView;
  const prepareMs = firstAt.get("boot") ?? NaN;
  const { boot_ms: bootMs, warm_ms: warmMs, freeze_ms: freezeMs } = snapshot.timings;
  return {
    wallMs,
    prepareMs,
    bootMs,
    warmMs,
    freezeMs,
    finishMs: wallMs - prepareMs - bootMs - warmMs - freezeMs,
    messages,
    snapshot,
  };
}

async function poolOf(d: BenchDaemon): Promise<Record<string, number>> {
  return (await d.api<{ pool: Record<string, number> }>("GET", "/v1/health")).pool;
}

/** Waits until every tag's pool holds `n` VMMs (a refill done), or `timeoutMs`: false then. */
async function waitPools(d: BenchDaemon, tags: string[], n: number, timeoutMs = 120_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const p = await poolOf(d);
    if (tags.every((t) => (p[t] ?? 0) >= n)) return true;
    await sleep(100);
  }
  return false;
}

/** Waits until `tag` has no pool (deleted, drained), so nothing of it runs beside the next sample. */
async function waitNoPool(d: BenchDaemon, tag: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline && ((await poolOf(d))[tag] ?? 0) > 0) await sleep(100);
}

interface Fork {
  readyMs: number;
  firstExecMs: number;
  fromPool: boolean;
  /** The daemon's timings: device state loaded and resumed; then the agent's IDENTITY reply. */
  restoreMs: number;
  identityMs: number;
  /** The daemon's whole fork (its view's total_ms): what is left of readyMs is the REST round trip. */
  daemonMs: number;
}

async function forkOnce(d: BenchDaemon, tag: string): Promise<Fork> {
  const t0 = performance.now();
  const r = await d.api<{
    sandboxes: {
      id: string;
      from_pool: boolean;
      timings: { restore_ms: number; ready_ms: number; total_ms: number };
    }[];
    failures: unknown[];
  }>("POST", "/v1/sandboxes", { snapshot_tag: tag, n: 1 });
  const t1 = performance.now();
  const sb = r.sandboxes[0];
  if (!sb) throw new Error(`fork of ${tag} failed: ${JSON.stringify(r.failures)}`);
  await d.api("POST", `/v1/sandboxes/${sb.id}/exec`, { cmd: ["true"] });
  const t2 = performance.now();
  await d.api("DELETE", `/v1/sandboxes/${sb.id}`);
  return {
    readyMs: t1 - t0,
    firstExecMs: t2 - t0,
    fromPool: sb.from_pool,
    restoreMs: sb.timings.restore_ms,
    identityMs: sb.timings.ready_ms - sb.timings.restore_ms,
    daemonMs: sb.timings.total_ms,
  };
}

async function main(): Promise<void> {
  process.on("unhandledRejection", (e) => log(`unhandled rejection: ${String(e)}`));
  const work = await mkdtemp(join(tmpdir(), "forkd-bench-image-"));
  const dataDir = await mkdtemp(join(tmpdir(), "forkd-bench-"));
  let reg: TestRegistry | null = null;
  let d: BenchDaemon | null = null;
  let failed = false;
  try {
    reg = await startRegistry(work);
    log(`registry on ${reg.host}; pushing the Debian test image`);
    const img = await pushDebianImage(reg.host);
    if (!img)
      throw new Error(
        "no python debootstrap stage under /var/cache/forkd/stages: build the python template first",
      );

    // 1. Pull + flatten, no VM (before the daemon starts: nothing else of ours runs).
    log(`pull + flatten: ${PULL_SAMPLES} cold pulls`);
    const pull = await measurePull(img, PULL_SAMPLES, join(work, "pull"));

    d = await startDaemon(dataDir, { FORKD_POOL_SIZE: String(POOL) });
    const daemon = d;
    const health = await daemon.api<{ accel: string; accel_reason: string }>("GET", "/v1/health");
    log(`daemon up (${health.accel}: ${health.accel_reason}), FORKD_POOL_SIZE=${POOL}`);
    const body = (kind: Kind, tag: string) => ({
      tag,
      ...(kind === "image" ? { image: img.ref } : { template: "python" }),
      memory_mib: MEMORY_MIB,
      warm_eval: WARM_EVAL,
    });

    // Warm-up, unmeasured: the image's first snapshot pulls it into the daemon's cache and
    // builds its guest image; the template's finds (or builds) its guest image. These two are
    // the parents the forks are measured on.
    const warmup: Record<Kind, { wallMs: number; built: string[] }> = {
      image: { wallMs: 0, built: [] },
      template: { wallMs: 0, built: [] },
    };
    const tags: Record<Kind, string> = { image: "img", template: "tpl" };
    const imageDirs: Record<Kind, string> = { image: "", template: "" };
    for (const kind of KINDS) {
      log(`warm-up: snapshot ${tags[kind]} from the ${kind}`);
      const c = await createStreamed(daemon, body(kind, tags[kind]));
      warmup[kind] = {
        wallMs: r1(c.wallMs),
        built: builtStages(c.messages),
      };
      imageDirs[kind] = c.snapshot.image.dir;
      log(`  ${r1(c.wallMs / 1000)} s; stages built: ${warmup[kind].built.join(", ") || "none"}`);
    }

    // 2. Creation from the cached image vs the cached template, interleaved; each deleted at once
    // (its pool drained) before the next.
    const created: Record<Kind, Creation[]> = { image: [], template: [] };
    for (let i = 0; i < SAMPLES; i++) {
      for (const kind of order(i)) {
        await waitPools(daemon, Object.values(tags), POOL);
        const tag = `c-${kind}-${i}`;
        log(`creation ${i + 1}/${SAMPLES}: ${kind}`);
        const c = await createStreamed(daemon, body(kind, tag));
        if (c.snapshot.image.dir !== imageDirs[kind])
          throw new Error(`${tag}: another guest image than the warm-up's`);
        const built = builtStages(c.messages);
        if (built.length > 0) log(`  note: built ${built.join(", ")}`);
        created[kind].push(c);
        log(
          `  ${r1(c.wallMs)} ms (prepare ${r1(c.prepareMs)}, boot ${r1(c.bootMs)}, warm ${r1(c.warmMs)}, freeze ${r1(c.freezeMs)})`,
        );
        await daemon.api("DELETE", `/v1/snapshots/${tag}`);
        await waitNoPool(daemon, tag);
      }
    }

    // 3. Fork → ready → first exec reply, interleaved, with both pools full before each fork.
    const forks: Record<Kind, Fork[]> = { image: [], template: [] };
    let poolShort = 0;
    for (const kind of KINDS) await forkOnce(daemon, tags[kind]); // one unmeasured fork of each
    for (let i = 0; i < FORKS; i++) {
      for (const kind of order(i)) {
        if (!(await waitPools(daemon, Object.values(tags), POOL))) poolShort++;
        forks[kind].push(await forkOnce(daemon, tags[kind]));
      }
    }
    log(`forks done (${poolShort} taken before a pool had refilled)`);

    const cm = (kind: Kind, k: keyof Omit<Creation, "messages" | "snapshot">) =>
      r1(median(created[kind].map((c) => c[k])));
    const fm = (kind: Kind, k: Exclude<keyof Fork, "fromPool">) => r1(median(forks[kind].map((f) => f[k])));
    const creation = Object.fromEntries(
      KINDS.map((k) => [
        k,
        {
          wallMs: cm(k, "wallMs"),
          prepareMs: cm(k, "prepareMs"),
          bootMs: cm(k, "bootMs"),
          warmMs: cm(k, "warmMs"),
          freezeMs: cm(k, "freezeMs"),
          finishMs: cm(k, "finishMs"),
          samplesWallMs: created[k].map((c) => r1(c.wallMs)),
        },
      ]),
    ) as Record<
      Kind,
      {
        wallMs: number;
        prepareMs: number;
        bootMs: number;
        warmMs: number;
        freezeMs: number;
        finishMs: number;
        samplesWallMs: number[];
      }
    >;
    const fork = Object.fromEntries(
      KINDS.map((k) => [
        k,
        {
          readyMs: fm(k, "readyMs"),
          firstExecMs: fm(k, "firstExecMs"),
          restoreMs: fm(k, "restoreMs"),
          identityMs: fm(k, "identityMs"),
          daemonMs: fm(k, "daemonMs"),
          fromPool: forks[k].filter((f) => f.fromPool).length,
          samplesReadyMs: forks[k].map((f) => r1(f.readyMs)),
          samplesFirstExecMs: forks[k].map((f) => r1(f.firstExecMs)),
        },
      ]),
    ) as Record<
      Kind,
      {
        readyMs: number;
        firstExecMs: number;
        restoreMs: number;
        identityMs: number;
        daemonMs: number;
        fromPool: number;
        samplesReadyMs: number[];
        samplesFirstExecMs: number[];
      }
    >;
    const result = {
      date: new Date().toISOString(),
      accel: health.accel,
      memoryMiB: MEMORY_MIB,
      poolSize: POOL,
      warmEval: WARM_EVAL,
      image: { ref: img.ref, digest: img.digest },
      pull: { ...pull, rows: pull.rows },
      warmup,
      creation: {
        samples: SAMPLES,
        ...creation,
        imageOverTemplate: r2(creation.image.wallMs / creation.template.wallMs),
      },
      fork: {
        samples: FORKS,
        ...fork,
        poolShort,
        readyImageOverTemplate: r2(fork.image.readyMs / fork.template.readyMs),
        firstExecImageOverTemplate: r2(fork.image.firstExecMs / fork.template.firstExecMs),
      },
    };

    console.log(
      `forkd image benchmark (${result.accel}, ${MEMORY_MIB} MiB guest, FORKD_POOL_SIZE=${POOL}, ${result.date})`,
    );
    console.log("");
    console.log(`1. pull + flatten, no VM`);
    for (const line of pullTable(pull)) console.log(line);
    console.log("");
    console.log(`2. snapshot creation, both cached (p50 of ${SAMPLES}, interleaved)`);
    console.log(`| | from the image | from the python template | image / template |`);
    console.log(`|---|---|---|---|`);
    const row = (name: string, a: number, b: number, unit = "ms") =>
      console.log(`| ${name} | ${a} ${unit} | ${b} ${unit} | ${r2(a / b)}x |`);
    const ci = creation.image;
    const ct = creation.template;
    row("total (request to snapshot)", ci.wallMs, ct.wallMs);
    row("image: pull check + guest image lookup", ci.prepareMs, ct.prepareMs);
    row("boot to agent + warm interpreter ready", ci.bootMs, ct.bootMs);
    row("warm-up (warm_eval)", ci.warmMs, ct.warmMs);
    row("freeze (sync, device state)", ci.freezeMs, ct.freezeMs);
    row("checksums, meta, publish", ci.finishMs, ct.finishMs);
    console.log(
      `(warm-up creations, unmeasured: image ${r1(warmup.image.wallMs / 1000)} s, built: ${warmup.image.built.join(", ") || "nothing"}; template ${r1(warmup.template.wallMs / 1000)} s, built: ${warmup.template.built.join(", ") || "nothing"})`,
    );
    console.log("");
    console.log(`3. fork (p50 of ${FORKS}, interleaved, both pools full before each fork)`);
    console.log(`| | image snapshot | template snapshot | image / template |`);
    console.log(`|---|---|---|---|`);
    row("fork → agent ready", fork.image.readyMs, fork.template.readyMs);
    row("fork → first exec reply", fork.image.firstExecMs, fork.template.firstExecMs);
    row("  of which the daemon's fork (total_ms)", fork.image.daemonMs, fork.template.daemonMs);
    row("  of which restore + resume", fork.image.restoreMs, fork.template.restoreMs);
    row("  of which the agent's IDENTITY reply", fork.image.identityMs, fork.template.identityMs);
    console.log(
      `(from the pool: image ${fork.image.fromPool}/${FORKS}, template ${fork.template.fromPool}/${FORKS}; ${poolShort} forks taken before the pools had refilled)`,
    );
    console.log(JSON.stringify(result));
    if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(result, null, 2) + "\n");
  } catch (e) {
    failed = true;
    throw e;
  } finally {
    if (d) {
      try {
        const { sandboxes } = await d.api<{ sandboxes: { id: string }[] }>("GET", "/v1/sandboxes");
        await Promise.all(
          sandboxes.map((s) => d!.api("DELETE", `/v1/sandboxes/${s.id}`).catch(() => undefined)),
        );
      } catch {
        /* daemon gone */
      }
      d.proc.kill("SIGKILL");
    }
    // VMs (parents, children, pool VMMs) outlive their daemon by design; a benchmark leaves none.
    for (const pid of await pidsReferencing(dataDir)) process.kill(pid, "SIGKILL");
    await reg?.stop();
    await rm(work, { recursive: true, force: true });
    if (failed) log(`benchmark failed; daemon log kept in ${dataDir}/daemon.log`);
    else await rm(dataDir, { recursive: true, force: true });
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
