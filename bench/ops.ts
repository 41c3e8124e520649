/**
 * The REST calls the benchmarks time, in one place: snapshot creation, a fork of one child, its
 * exec, eval and kill, a branch, and waiting for the daemon's pools of pre-started VMMs to settle.
 */
import type { BenchDaemon } from "./daemon.js";

export interface Timings {
  launch_ms: number;
  restore_ms: number;
  ready_ms: number;
  total_ms: number;
}

export interface SandboxView {
  id: string;
  pid: number;
  from_pool: boolean;
  timings: Timings;
}

export interface Forked extends SandboxView {
  /** Client wall time of the fork: POST to the reply (the child's agent answered). */
  ms: number;
}

export interface BranchReply {
  tag: string;
  status: string;
  pause_ms: number;
  private_bytes: number;
  /** Client wall time: POST to the reply (with wait, the snapshot is ready). */
  ms: number;
}

export interface SnapshotMetaView {
  tag: string;
  nic?: unknown;
  timings: { boot_ms: number; warm_ms: number; freeze_ms: number };
}

export type Api = BenchDaemon["api"];

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export async function createSnapshot(
  api: Api,
  body: { tag: string; memory_mib: number; warm_eval?: string } & Record<string, unknown>,
): Promise<SnapshotMetaView> {
  return api<SnapshotMetaView>("POST", "/v1/snapshots", body);
}

export async function forkOne(api: Api, tag: string): Promise<Forked> {
  const t0 = performance.now();
  const r = await api<{ sandboxes: SandboxView[]; failures: { message: string }[] }>(
    "POST",
    "/v1/sandboxes",
    {
      snapshot_tag: tag,
      n: 1,
    },
  );
  const ms = performance.now() - t0;
  const sb = r.sandboxes[0];
  if (!sb) throw new Error(`fork of ${tag} failed: ${r.failures[0]?.message ?? "no sandbox"}`);
  return { ...sb, ms };
}

export const kill = (api: Api, id: string): Promise<unknown> => api("DELETE", `/v1/sandboxes/${id}`);

export async function execTrue(api: Api, id: string): Promise<void> {
  const r = await api<{ exit_code: number }>("POST", `/v1/sandboxes/${id}/exec`, { cmd: ["true"] });
  if (r.exit_code !== 0) throw new Error(`exec true in ${id} exited ${r.exit_code}`);
}

/** Runs a cell in the sandbox's warm Python kernel; throws if it raised. Returns its value. */
export async function evalCell(api: Api, id: string, code: string, timeoutMs = 600_000): Promise<unknown> {
  const r = await api<{ ok: boolean; value: unknown; error: unknown }>("POST", `/v1/sandboxes/${id}/eval`, {
    code,
    timeout_ms: timeoutMs,
  });
  if (!r.ok) throw new Error(`cell failed in ${id}: ${JSON.stringify(r.error)}`);
  return r.value;
}

/** A cell that keeps `mib` MiB of fresh random bytes alive in the kernel (written guest memory). */
export const writeCell = (name: string, mib: number): string =>
  `${name} = bytearray(__import__("os").urandom(${Math.round(mib * 1024)} << 10))`;

export async function branch(api: Api, id: string, tag: string): Promise<BranchReply> {
  const t0 = performance.now();
  const r = await api<Omit<BranchReply, "ms">>("POST", `/v1/sandboxes/${id}/branch`, { tag });
  return { ...r, ms: performance.now() - t0 };
}

/** Pre-started VMMs per snapshot tag, as the daemon reports them. */
export async function poolStatus(api: Api): Promise<Record<string, number>> {
  return (await api<{ pool?: Record<string, number> }>("GET", "/v1/health")).pool ?? {};
}

const poolCount = async (api: Api, tag: string | null): Promise<number> => {
  const p = await poolStatus(api);
  return tag === null ? Object.values(p).reduce((a, b) => a + b, 0) : (p[tag] ?? 0);
};

/**
 * Waits until the pool of `tag` (null: all pools together) has `target` VMMs, or without a
 * target until its count has not changed for `stableMs`; at most `maxMs`. Returns the count.
 */
export async function settlePool(
  api: Api,
  tag: string | null,
  opts: { target?: number; stableMs?: number; maxMs: number },
): Promise<number> {
  const t0 = performance.now();
  let last = await poolCount(api, tag);
  let since = t0;
  for (;;) {
    if (opts.target !== undefined && last >= opts.target) return last;
    const now = performance.now();
    if (opts.target === undefined && now - since >= (opts.stableMs ?? 1000)) return last;
    if (now - t0 >= opts.maxMs) return last;
    await sleep(100);
    const c = await poolCount(api, tag);
    if (c !== last) {
      last = c;
      since = performance.now();
    }
  }
}

/**
 * Keeps each sample's start alike: `learn(tag)` (after one unmeasured fork of it) waits until
 * the tag's pool stops changing and remembers its count; `ready(tag)` waits (at most
 * `settleMs`) until the pool is back to that count, as it is between a backend's requests.
 */
export function poolSettler(api: Api, settleMs: number) {
  const targets = new Map<string, number>();
  return {
    async learn(tag: string): Promise<number> {
      const n = await settlePool(api, tag, { maxMs: settleMs, stableMs: 1000 });
      targets.set(tag, n);
      return n;
    },
    async ready(tag: string): Promise<void> {
      const target = targets.get(tag);
      if (target === undefined) await this.learn(tag);
      else await settlePool(api, tag, { target, maxMs: settleMs });
    },
  };
}

/**
 * `n` samples of `one`, in order, riding out a few failed ones (a loaded machine can time out a
 * fork): each failure's message is added to `failures`, and more than `maxFailures` of them
 * throws the last. `one` cleans up after itself when it fails.
 */
export async function samples<T>(
  n: number,
  one: (i: number) => Promise<T>,
  failures: string[],
  maxFailures = Math.max(2, Math.ceil(n / 3)),
): Promise<T[]> {
  const out: T[] = [];
  let failed = 0;
  for (let i = 0; out.length < n; i++) {
    try {
      out.push(await one(i));
    } catch (e) {
      failures.push(e instanceof Error ? e.message : String(e));
      if (++failed > maxFailures) throw e;
    }
  }
  return out;
}

/** `use(child)` on a fresh child of `tag`, the child killed afterwards whatever happens. */
export async function withChild<T>(api: Api, tag: string, use: (sb: Forked) => Promise<T>): Promise<T> {
  const sb = await forkOne(api, tag);
  try {
    return await use(sb);
  } finally {
    await kill(api, sb.id).catch(() => undefined);
  }
}

/** A note on the failed samples of a part (empty when none failed). */
export const failureNote = (failures: readonly string[]): string =>
  failures.length ? `${failures.length} failed sample(s) retried, first: ${failures[0]?.slice(0, 120)}` : "";
