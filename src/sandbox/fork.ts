/**
 * FORK: `n` children of a snapshot in one fan-out. Each child gets a VMM (a pre-started one
 * from the warm pool when it has no network, else a new one: prepare.ts), its limits, its
 * network, the snapshot's device state (a hot member has it already) and its identity; it is recorded and registered once its
 * agent answers. A failed child is cleaned up and reported without failing its siblings.
 */
import { randomBytes } from "node:crypto";
import { rm } from "node:fs/promises";
import type { Attachment } from "../net/index.js";
import { NO_NETWORK } from "../net/index.js";
import type { NetworkSpec } from "../net/index.js";
import type { Snapshot } from "../snapshot/index.js";
import { fsyncDir, writeFileAtomic } from "../util/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { ErrorCode } from "../util/index.js";
import { nowMs, since } from "../util/index.js";
import type { SandboxContext } from "./context.js";
import { armDiskLimit } from "./disk-limit.js";
import { MAX_FORK } from "./limits.js";
import { discard } from "./pool.js";
import type { Prepared } from "./pool.js";
import { prepare } from "./prepare.js";
import { saveRecord } from "./record.js";
import { fanoutJournal } from "./recovery.js";
import { register } from "./register.js";
import { restoreChild } from "./restore.js";
import { kill, retire } from "./retire.js";
import { GUEST_DEFAULT_PIDS } from "./sandbox.js";
import type { E2bRecord, ReadonlySandbox, Sandbox, SandboxLimits, SandboxRecord } from "./sandbox.js";
import { settleWithLimit } from "../util/index.js";
import { limitsFor } from "../vmm/index.js";

/** How long a child whose link is set up may take to see its carrier (the fork waits for it). */
export const NET_UP_WAIT_MS = 2_000;

export interface ForkFailure {
  index: number;
  code: ErrorCode;
  message: string;
}

export interface ForkResult {
  sandboxes: ReadonlySandbox[];
  failures: ForkFailure[];
}

export interface ForkOptions {
  /** Idle timeout in ms (null or absent: none). */
  timeoutMs?: number | null;
  /** What the idle timeout does (default kill). */
  onIdle?: "kill" | "pause";
  metadata?: Record<string, string>;
  /** The tenant it belongs to (null: an admin's). */
  owner?: string | null;
  /** Limits; unset fields take the defaults (limitsFor). */
  limits?: SandboxLimits;
  /** The children's network (default none). */
  network?: NetworkSpec;
  /** Sandbox-wide environment: every command of each child sees it (record.env). */
  env?: Record<string, string>;
  /** An absolute timeout, counted from each child's creation (null or absent: none). */
  deadlineMs?: number | null;
  /** What the deadline does (default kill). */
  onDeadline?: "kill" | "pause";
  /** E2B's settings (src/e2b), kept in the record. */
  e2b?: E2bRecord;
}

/**
 * Forks `n` children of snapshot `tag` in parallel. Returns when every child has answered its
 * agent or failed; a failed child is cleaned up and reported without failing its siblings.
 */
export async function forkChildren(
  ctx: SandboxContext,
  tag: string,
  n: number,
  opts: ForkOptions = {},
): Promise<ForkResult> {
  if (!Number.isInteger(n) || n < 1 || n > MAX_FORK) {
    throw new ForkdError("invalid_argument", `n must be an integer in 1..${MAX_FORK}`, { field: "n" });
  }
  // In a cluster: new work only while a member, and a snapshot held elsewhere fetched first.
  if (ctx.cluster) {
    ctx.cluster.admit("fork");
    await ctx.cluster.ensureSnapshot(tag);
  }
  // A snapshot still being written (an async branch) is waited for, briefly; never half-read.
  const snap = await ctx.store.getReady(tag, ctx.writingWaitMs);
  ctx.net.check(opts.network ?? NO_NETWORK, snap.meta.nic, tag);
  const max = ctx.maxSandboxes;
  const held = ctx.live.held;
  if (held + n > max) {
    throw new ForkdError(
      "resource_exhausted",
      `forking ${n} would exceed the limit of ${max} sandboxes (${held} exist)`,
      {
        limit: max,
        existing: held,
      },
    );
  }
  const started = ctx.live.starting(tag, n);
  // Only forks the pool can serve (no network) make a snapshot's members wanted.
  if ((opts.network ?? NO_NETWORK).mode === "none") ctx.pool.use(snap.meta.tag);
  // Until the reply goes out, only this journal says who the children are for: a daemon that
  // dies first adopts them as unclaimed (recovery.ts). Written while the first VMMs start.
  const fanout = randomBytes(6).toString("hex");
  const journal = fanoutJournal(ctx.root, fanout);
  const journaled = writeFileAtomic(journal, `${new Date().toISOString()}\n`, 0o600);
  journaled.catch(() => undefined);
  // Bounded parallelism: starting every VMM at once makes them all contend and none finish
  // early; a few in flight per core keeps the CPU busy with less thrashing.
  const results = await settleWithLimit(n, ctx.forkParallelism, () =>
    forkOne(ctx, snap, opts, { id: fanout, journaled }),
  ).finally(() => {
    started();
    ctx.pool.refill();
  });
  const out: ForkResult = { sandboxes: [], failures: [] };
  results.forEach((r, index) => {
    if (r.status === "fulfilled") out.sandboxes.push(r.value);
    else {
      const e = r.reason as unknown;
      out.failures.push({
        index,
        code: e instanceof ForkdError ? e.code : "internal",
        message: errorMessage(e),
      });
    }
  });
  if (out.failures.length > 0)
    ctx.log.warn("fork: some children failed", { tag, failed: out.failures.length, n });
  // In a cluster the children are recorded where they run before the reply names them; a node
  // that cannot record them (cut off) kills them: nothing runs that the cluster does not know.
  if (ctx.cluster && out.sandboxes.length > 0) {
    try {
      await ctx.cluster.recordForked(out.sandboxes);
    } catch (e) {
      await Promise.all(out.sandboxes.map((sb) => kill(ctx, sb.record.id).catch(() => undefined)));
      await rm(journal, { force: true }).catch(() => undefined);
      throw e;
    }
  }
  ctx.crash("fork:after-record");
  // The reply goes out now, naming every child: they are their client's.
  await rm(journal, { force: true })
    .then(() => fsyncDir(ctx.root))
    .catch((e: unknown) => ctx.log.warn("fork: journal not removed", { error: errorMessage(e) }));
  return out;
}

/** One child of the fan-out `fanout`: its VMM, network, restore, identity, record, registration. */
async function forkOne(
  ctx: SandboxContext,
  snap: Snapshot,
  opts: ForkOptions,
  fanout: { id: string; journaled: Promise<void> },
): Promise<Sandbox> {
  const tag = snap.meta.tag;
  const nic = snap.meta.nic;
  const spec = opts.network ?? NO_NETWORK;
  const t0 = nowMs();
  // Pre-started VMMs have no network backend: they serve children without one.
  const pooled = spec.mode === "none" ? ctx.pool.take(tag, snap.meta.checksum) : null;
  let net: Attachment | null = null;
  let p: Prepared;
  try {
    net = await ctx.net.attach(spec, nic);
    p = pooled ?? (await prepare(ctx, snap, net));
  } catch (e) {
    await net?.release();
    if (pooled) await discard(pooled);
    throw e;
  }
  const launchMs = since(t0);
  const limits = limitsFor(snap.meta.machine, opts.limits);
  const cgroups = ctx.cgroups;
  let registered: Sandbox | null = null;
  try {
    // Pre-started with the defaults: the request's own limits are set before the guest runs.
    if (opts.limits && cgroups) await cgroups.apply(p.id, limits);
    const t1 = nowMs();
    // A hot member was restored and warmed already (pool-warm.ts), link down: it only continues.
    if (!p.hot) await restoreChild(ctx, p.vm, snap);
    // The link as the snapshot saved it (a hot member's: down), unless this child wants the other state.
    const linkUp = p.hot ? false : nic?.linkUp;
    if (nic && linkUp !== net.linkUp) await p.vm.setLink(net.linkUp);
    await p.vm.resume();
    const restoreMs = since(t1);
    await p.agent.identity(
      {
        hostname: p.id,
        sandboxId: p.id,
        ...(typeof opts.limits?.pids === "number" ? { pidsMax: opts.limits.pids } : {}),
        netUpWaitMs: nic && net.linkUp ? NET_UP_WAIT_MS : undefined,
      },
      ctx.readyTimeoutMs,
    );
    await net.start();
    const readyMs = since(t1);
    const limited = cgroups !== undefined && cgroups.mode !== "none";
    const created = new Date();
    const deadlineMs = opts.deadlineMs ?? null;
    const record: SandboxRecord = {
      format: 1,
      id: p.id,
      tag,
      pid: p.vm.pid,
      pidStartTime: p.vm.id.startTime,
      created: created.toISOString(),
      timings: { launchMs, restoreMs, readyMs, totalMs: since(t0) },
      fromPool: pooled !== null,
      ...(p.hot ? { hotPool: true } : {}),
      timeoutMs: opts.timeoutMs ?? null,
      metadata: opts.metadata ?? {},
      onIdle: opts.onIdle ?? "kill",
      owner: opts.owner ?? null,
      limits: {
        memoryMiB: limited ? (limits.memoryMiB ?? null) : null,
        cpus: limited ? (limits.cpus ?? null) : null,
        pids: opts.limits?.pids ?? GUEST_DEFAULT_PIDS,
        diskMiB: opts.limits?.diskMiB ?? null,
        lifetimeMs: opts.limits?.lifetimeMs ?? null,
      },
      network: net.record(),
      fanout: fanout.id,
      ...(opts.env && Object.keys(opts.env).length > 0 ? { env: opts.env } : {}),
      ...(deadlineMs !== null
        ? {
            deadline: new Date(created.getTime() + deadlineMs).toISOString(),
            onDeadline: opts.onDeadline ?? "kill",
          }
        : {}),
      ...(opts.e2b ? { e2b: opts.e2b } : {}),
    };
    await fanout.journaled;
    ctx.crash("fork:before-record");
    await saveRecord(p.dir, record);
    registered = register(ctx, record, p.dir, p.vm, p.agent, net);
    // A snapshot branched from a sandbox with commands running carries them into each child.
    registered.commands.adopt(await p.agent.inherited(ctx.readyTimeoutMs));
    await armDiskLimit(ctx, registered);
    return registered;
  } catch (e) {
    if (registered) {
      // Registered: retire() ends its VMM, network and directory, and it is not listed.
      ctx.live.delete(registered.record.id);
      await retire(registered, "failed to start", true);
    } else {
      await discard(p);
      await net.release();
    }
    throw e;
  }
}
