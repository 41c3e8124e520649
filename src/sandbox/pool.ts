/**
 * The warm pool: pre-started VMMs of snapshots, bounded for the host. A member is QEMU already
 * running with the snapshot's memory mapped, its disk layer in place, QMP and the agent socket
 * connected; a hot one (the default) is also restored, warmed and stopped again (pool-warm.ts),
 * so a fork that takes it only continues it and sends the child's identity. How many members
 * each snapshot gets is pool-policy.ts: the host's total goes to the snapshots forked most
 * (a decayed count) and most recently, a snapshot not forked for a while gets none. One member
 * is made at a time for the whole host, after forks (they do not compete for the CPU).
 */
import { rm } from "node:fs/promises";
import type { AgentClient } from "../agent/index.js";
import { errorMessage } from "../util/index.js";
import type { Vm } from "../vmm/index.js";
import type { Logger } from "../util/index.js";
import { bump, decayed, poolTargets } from "./pool-policy.js";
import type { PoolLimits, Usage } from "./pool-policy.js";

export interface Prepared {
  id: string;
  dir: string;
  vm: Vm;
  agent: AgentClient;
  launchMs: number;
  /** Restored, warmed and stopped (pool-warm.ts): a fork continues it instead of restoring it. */
  hot?: boolean;
  /** Its memory (PSS, MiB) when it joined the pool; the pool's memory bound counts it. */
  memMiB?: number;
  /**
   * The checksum of the snapshot meta it was made from: a tag deleted and made again (or whose
   * memory was rewritten by a forced delete of its base) has another, and its old members are
   * never handed out.
   */
  checksum?: string;
}

export interface PoolOptions extends PoolLimits {
  /** Members are made hot (FORKD_POOL_HOT). */
  hot: boolean;
  /** How often idle snapshots are drained (ms). */
  sweepMs?: number;
  /** A snapshot whose member failed to start gets no new one for this long (ms). */
  retryMs?: number;
}

/** Makes a member of `tag` (hot or not). */
export type PrepareMember = (tag: string, hot: boolean) => Promise<Prepared>;

/** The pool as the daemon reports it (health, metrics). */
export interface PoolState {
  total: number;
  hot: number;
  cold: number;
  max: number;
  maxMiB: number | null;
  memMiB: number;
  tags: Record<string, { ready: number; hot: number; target: number; score: number }>;
}

/** What a member of a snapshot costs before one was measured (MiB). */
const DEFAULT_MEMBER_MIB = 48;
/** A snapshot whose hot warm-up failed gets cold members for this long (no retry loop). */
const COLD_AFTER_FAILURE_MS = 10 * 60_000;

/** The pool's settings when the daemon names none (docs/operations.md). */
export function poolDefaults(): PoolOptions {
  return { perTag: 2, max: 8, idleMs: 5 * 60_000, halfLifeMs: 10 * 60_000, hot: true };
}

export class WarmPool {
  private readonly ready = new Map<string, Prepared[]>();
  private readonly usage = new Map<string, Usage>();
  /** Snapshots that get no member until then (a start failed). */
  private readonly retryAt = new Map<string, number>();
  /** Snapshots whose warm-up failed: cold members until then. */
  private readonly coldUntil = new Map<string, number>();
  /** The memory of a snapshot's last member (MiB). */
  private readonly memSeen = new Map<string, number>();
  /** Bumped by drain(): a member being made across a drain of its tag is discarded. */
  private readonly epochs = new Map<string, number>();
  private filling: Promise<void> | null = null;
  private closed = false;
  private readonly sweeper: ReturnType<typeof setInterval> | null;

  constructor(
    private readonly opts: PoolOptions,
    private readonly prepare: PrepareMember,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
    /** Told when the members of `tag` ready now change (taken, made, drained). */
    private readonly onChange: (tag: string, ready: number) => void = () => undefined,
  ) {
    this.sweeper =
      opts.max > 0 && opts.perTag > 0 ? setInterval(() => this.rebalance(), opts.sweepMs ?? 10_000) : null;
    this.sweeper?.unref();
  }

  private get enabled(): boolean {
    return !this.closed && this.opts.max > 0 && this.opts.perTag > 0;
  }

  /** Counts a fork of (or the making of) `tag`: the pool's total goes to the snapshots used most. */
  use(tag: string): void {
    if (!this.enabled) return;
    this.usage.set(tag, bump(this.usage.get(tag), this.now(), this.opts.halfLifeMs));
    this.trim();
  }

  /**
   * A pre-started VMM for `tag`, or null (never one whose VMM or agent is gone). Does not refill:
   * the caller does once its fork is done, so starting replacements does not compete with it.
   */
  take(tag: string, checksum?: string): Prepared | null {
    if (!this.enabled) return null;
    const list = this.ready.get(tag) ?? [];
    let p: Prepared | undefined;
    while ((p = list.shift())) {
      const stale = checksum !== undefined && p.checksum !== undefined && p.checksum !== checksum;
      if (!stale && !p.vm.exited && !p.agent.closed) break;
      if (stale)
        this.log.warn("pool: a member of an older snapshot of this tag, discarded", { tag, id: p.id });
      else this.log.warn("pool: a member died while waiting", { tag, id: p.id });
      void discard(p);
    }
    if (list.length === 0) this.ready.delete(tag);
    if (p) this.changed(tag);
    return p ?? null;
  }

  private changed(tag: string): void {
    try {
      this.onChange(tag, this.ready.get(tag)?.length ?? 0);
    } catch {
      // a listener's failure is its own
    }
  }

  /** Pre-started VMMs waiting, by snapshot tag. */
  status(): Record<string, number> {
    return Object.fromEntries([...this.ready].map(([tag, list]) => [tag, list.length]));
  }

  /** The whole pool: totals, bounds, and per snapshot its members, target and decayed fork count. */
  state(): PoolState {
    const targets = this.targets();
    const tags: PoolState["tags"] = {};
    let total = 0;
    let hot = 0;
    let memMiB = 0;
    for (const tag of new Set([...this.ready.keys(), ...targets.keys()])) {
      const list = this.ready.get(tag) ?? [];
      const h = list.filter((p) => p.hot).length;
      const u = this.usage.get(tag);
      tags[tag] = {
        ready: list.length,
        hot: h,
        target: targets.get(tag) ?? 0,
        score: u ? Math.round(decayed(u, this.now(), this.opts.halfLifeMs) * 100) / 100 : 0,
      };
      total += list.length;
      hot += h;
      memMiB += list.reduce((a, p) => a + (p.memMiB ?? 0), 0);
    }
    return {
      total,
      hot,
      cold: total - hot,
      max: this.opts.max,
      maxMiB: this.opts.maxMiB ?? null,
      memMiB: Math.round(memMiB),
      tags,
    };
  }

  /** Trims the pool to its targets and makes missing members (one at a time, in the background). */
  refill(): void {
    this.rebalance();
  }

  /** Kills the pooled VMMs of `tag` and forgets its forks (its snapshot is going away). */
  async drain(tag: string): Promise<void> {
    const list = this.ready.get(tag) ?? [];
    this.ready.delete(tag);
    this.epochs.set(tag, (this.epochs.get(tag) ?? 0) + 1);
    this.usage.delete(tag);
    this.retryAt.delete(tag);
    this.coldUntil.delete(tag);
    this.memSeen.delete(tag);
    if (list.length > 0) this.changed(tag);
    await Promise.all(list.map(discard));
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.sweeper) clearInterval(this.sweeper);
    // A member being made when the pool closes is discarded by makeOne (closed): wait for it,
    // so no VMM outlives the pool.
    await this.filling;
    await Promise.all([...this.ready.keys()].map((t) => this.drain(t)));
  }

  private targets(): Map<string, number> {
    if (!this.enabled) return new Map();
    return poolTargets(this.usage, this.now(), this.opts, (t) => this.memSeen.get(t) ?? DEFAULT_MEMBER_MIB);
  }

  private rebalance(): void {
    if (!this.enabled) return;
    this.trim();
    this.fill();
  }

  /** Kills the members a snapshot has beyond its target (forgets snapshots with none and no use). */
  private trim(): void {
    const targets = this.targets();
    for (const [tag, list] of this.ready) {
      const extra = list.length - (targets.get(tag) ?? 0);
      if (extra <= 0) continue;
      const gone = list.splice(0, extra);
      if (list.length === 0) this.ready.delete(tag);
      this.log.info("pool: drained", { tag, members: gone.length, left: list.length });
      this.changed(tag);
      for (const p of gone) void discard(p);
    }
    const t = this.now();
    for (const [tag, u] of this.usage) {
      if (t - u.at > this.opts.idleMs && !this.ready.has(tag)) this.usage.delete(tag);
    }
  }

  /** The first snapshot, best first, that lacks members and may get one now. */
  private next(): string | null {
    const t = this.now();
    for (const [tag, n] of this.targets()) {
      if ((this.ready.get(tag)?.length ?? 0) >= n) continue;
      if ((this.retryAt.get(tag) ?? 0) > t) continue;
      return tag;
    }
    return null;
  }

  private fill(): void {
    if (this.filling) return;
    // Started a tick later, so that `filling` is set before the loop can finish and clear it.
    this.filling = Promise.resolve().then(() => this.fillLoop());
  }

  private async fillLoop(): Promise<void> {
    try {
      for (;;) {
        // targets move with time too (a snapshot going idle frees room): trim before each member
        this.trim();
        const tag = this.enabled && !this.closed ? this.next() : null;
        if (tag === null) break;
        await this.makeOne(tag);
      }
    } catch (e) {
      this.log.warn("pool: filling stopped", { reason: errorMessage(e) });
    } finally {
      this.filling = null;
    }
  }

  private async makeOne(tag: string): Promise<void> {
    const hot = this.opts.hot && (this.coldUntil.get(tag) ?? 0) <= this.now();
    const epoch = this.epochs.get(tag) ?? 0;
    let p: Prepared;
    try {
      p = await this.prepare(tag, hot);
    } catch (e) {
      // never retried in a loop: the snapshot waits, and a failed warm-up makes it cold for a while
      this.retryAt.set(tag, this.now() + (this.opts.retryMs ?? 30_000));
      if (hot) this.coldUntil.set(tag, this.now() + COLD_AFTER_FAILURE_MS);
      this.log.warn(hot ? "pool: a hot member failed, discarded" : "pool: could not pre-start a VMM", {
        tag,
        reason: errorMessage(e),
      });
      return;
    }
    if (p.memMiB !== undefined) this.memSeen.set(tag, p.memMiB);
    // still wanted? (the snapshot may have gone idle, been drained, or the pool closed meanwhile)
    this.trim();
    const want = this.targets().get(tag) ?? 0;
    const list = this.ready.get(tag) ?? [];
    const total = [...this.ready.values()].reduce((a, l) => a + l.length, 0);
    const drained = (this.epochs.get(tag) ?? 0) !== epoch;
    if (
      this.closed ||
      drained ||
      !this.enabled ||
      !this.usage.has(tag) ||
      list.length >= want ||
      total >= this.opts.max
    ) {
      await discard(p);
      return;
    }
    list.push(p);
    this.ready.set(tag, list);
    this.changed(tag);
  }
}

/** Ends a pre-started VMM that will serve no child: its agent connection, its process, its directory. */
export async function discard(p: Prepared): Promise<void> {
  p.agent.close();
  await p.vm.kill().catch(() => undefined);
  await rm(p.dir, { recursive: true, force: true });
}
