/**
 * The sandbox service: the one owner of sandbox state; the API layer only calls it. This class
 * is its facade: it builds the shared context (context.ts) and hands each call to the file of
 * its operation:
 *   registry.ts        the live registry (and children being forked)
 *   sweeper.ts         idle timeout, deadline and lifetime
 *   fork.ts            fan-out of children (prepare.ts starts a VMM; pool.ts keeps some hot)
 *   branch.ts          BRANCH (a running sandbox becomes a snapshot)
 *   pause.ts resume.ts suspend and resume
 *   network-change.ts  exposed ports and egress of a running sandbox
 *   e2b-settings.ts    E2B's settings kept in the record (src/e2b)
 *   disk-limit.ts jail-reads.ts  a sandbox's disk limit; what its jailed VMM may read
 *   lease.ts           the agent for one API operation
 *   retire.ts          kill and retire; register.ts watches a VMM for its end
 *   adopt.ts           recovery after a daemon restart (recovery.ts: records left mid-way)
 */
import { dirname, join } from "node:path";
import type { AgentClient } from "../agent/index.js";
import type { Cgroups } from "../host/index.js";
import { NetworkService } from "../net/index.js";
import type { Egress } from "../net/index.js";
import type { SnapshotStore } from "../snapshot/index.js";
import { NO_CRASH } from "../util/index.js";
import type { CrashPoint } from "../util/index.js";
import type { Logger } from "../util/index.js";
import type { SandboxEventSink } from "./registry.js";
import type { SandboxCluster } from "./cluster.js";
import { Quarantine } from "../util/index.js";
import type { VmmDriver } from "../vmm/index.js";
import { forkdLiveCapture } from "../vmm/index.js";
import type { LiveCapturer, LiveMode } from "../vmm/index.js";
import { forkdMemsnap } from "../vmm/index.js";
import { JailedTools } from "../vmm/index.js";
import type { ToolRunner } from "../vmm/index.js";
import type { MemoryDiffs } from "../vmm/index.js";
import { Strays } from "../vmm/index.js";
import { recover } from "./adopt.js";
import type { Recovered } from "./adopt.js";
import { branch } from "./branch.js";
import type { BranchResult } from "./branch.js";
import type { CommandTable } from "./commands/table.js";
import type { SandboxContext } from "./context.js";
import { forkChildren } from "./fork.js";
import type { ForkOptions, ForkResult } from "./fork.js";
import { lease, use } from "./lease.js";
import type { Lease } from "./lease.js";
import { exposePort, setEgress, unexposePort } from "./network-change.js";
import { pause } from "./pause.js";
import { WarmPool, poolDefaults } from "./pool.js";
import type { PoolOptions, PoolState } from "./pool.js";
import { poolMember } from "./pool-warm.js";
import { SandboxRegistry } from "./registry.js";
import { resume } from "./resume.js";
import type { ResumeOptions } from "./resume.js";
import { kill } from "./retire.js";
import type { E2bRecord, ReadonlySandbox, Sandbox } from "./sandbox.js";
import { detachAll, killAll } from "./shutdown.js";
import { setDeadline, setIdleTimeout, Sweeper } from "./sweeper.js";
import { setE2bSettings } from "./e2b-settings.js";

export interface SandboxServiceOptions {
  root: string;
  store: SnapshotStore;
  driver: VmmDriver;
  /** Host-side limits per sandbox (the driver's jail joins each VMM to its cgroup). */
  cgroups?: Cgroups;
  log: Logger;
  /** TCG translation buffer per child (MiB). */
  tbSizeMiB?: number;
  /** Pre-started VMMs kept per recently forked snapshot (0: none). */
  poolSize?: number;
  /** The warm pool's host-wide bounds and policy (pool.ts; defaults: poolDefaults()). */
  pool?: Partial<PoolOptions>;
  /** Children started at once during a fan-out (default: all). */
  forkParallelism?: number;
  /** Sandboxes (running, exited-but-listed and starting) the daemon will hold at once. */
  maxSandboxes?: number;
  readyTimeoutMs?: number;
  /** How long a fork waits for a snapshot that is still being written. */
  writingWaitMs?: number;
  /** native/memsnap/forkd-memsnap, for BRANCH and pause. */
  memsnap?: string;
  /** How private memory pages are captured and applied (default: forkd-memsnap at `memsnap`). */
  memory?: MemoryDiffs;
  /** When a BRANCH captures memory live (FORKD_BRANCH_LIVE; default auto). */
  branchLive?: LiveMode;
  /** How a BRANCH captures live (default: forkd-memsnap live at `memsnap`; none without it). */
  liveCapture?: LiveCapturer;
  /** Host networking (absent: children can only have network none). */
  network?: NetworkService;
  /** Finds and kills VMMs a dead daemon left (default: QEMU and memsnap processes by path). */
  strays?: Strays;
  /** Where recovery moves records it cannot read (default: <root>/../quarantine). */
  quarantine?: Quarantine;
  /** Test-only fault injection (src/util/crash.ts). */
  crash?: CrashPoint;
  /** Where sandboxes' creation, state changes and ends are told (src/events/bus.ts). */
  events?: SandboxEventSink;
  /** Runs qemu-img on what VMMs wrote, jailed (default: as the daemon, unjailed: tests). */
  tools?: ToolRunner;
  /** The cluster this node is a member of (cluster.ts; absent: a daemon alone). */
  cluster?: SandboxCluster;
}

export class SandboxService {
  private readonly ctx: SandboxContext;
  private readonly sweeper: Sweeper;

  constructor(o: SandboxServiceOptions) {
    const ctx: SandboxContext = {
      root: o.root,
      store: o.store,
      driver: o.driver,
      cgroups: o.cgroups,
      log: o.log,
      tbSizeMiB: o.tbSizeMiB,
      forkParallelism: o.forkParallelism ?? Infinity,
      maxSandboxes: o.maxSandboxes ?? 1000,
      readyTimeoutMs: o.readyTimeoutMs ?? 60_000,
      writingWaitMs: o.writingWaitMs ?? 60_000,
      memsnap: o.memory ?? (o.memsnap ? forkdMemsnap(o.memsnap) : null),
      liveCapture: o.liveCapture ?? (o.memsnap ? forkdLiveCapture(o.memsnap) : null),
      branchLive: o.branchLive ?? "auto",
      net: o.network ?? NetworkService.disabled(o.log),
      strays: o.strays ?? new Strays([o.driver.binary, ...(o.memsnap ? [o.memsnap] : [])], o.log),
      quarantine: o.quarantine ?? new Quarantine(join(dirname(o.root), "quarantine"), o.log),
      crash: o.crash ?? NO_CRASH,
      tools: o.tools ?? new JailedTools(null, null),
      live: new SandboxRegistry(o.events),
      pool: new WarmPool(
        { ...poolDefaults(), perTag: o.poolSize ?? 0, ...o.pool },
        (tag, hot) => poolMember(ctx, tag, hot),
        o.log,
        undefined,
        // Its members' comings and goings are told (a cluster publishes each snapshot's warmth).
        (tag, ready) => o.events?.emit({ type: "pool", tag, ready }),
      ),
      cluster: o.cluster ?? null,
    };
    this.ctx = ctx;
    this.sweeper = new Sweeper(ctx);
  }

  /** Pre-starts VMMs for `tag` now, so its first fork is as fast as later ones. */
  prewarm(tag: string): void {
    this.ctx.pool.use(tag);
    this.ctx.pool.refill();
  }

  /** Stops pre-starting VMMs for `tag` and kills those waiting (before its snapshot is deleted). */
  async forgetSnapshot(tag: string): Promise<void> {
    await this.ctx.pool.drain(tag);
  }

  /** Every sandbox held (running, paused, exited and still listed), oldest first. */
  list(): ReadonlySandbox[] {
    return this.ctx.live.list();
  }

  get(id: string): Sandbox {
    return this.ctx.live.get(id);
  }

  /**
   * The sandbox's agent for one API operation: the sandbox counts as in use (never idle) until
   * release() is called, and its idle timeout restarts then (lease.ts).
   */
  lease(id: string): Lease {
    return lease(this.ctx.live, id);
  }

  /** Runs `fn` with the sandbox's agent, leased for its duration. */
  use<T>(id: string, fn: (agent: AgentClient, commands: CommandTable) => Promise<T>): Promise<T> {
    return use(this.ctx.live, id, fn);
  }

  /**
   * BRANCH: snapshots the running sandbox `id` as `tag` (branch.ts). `priv`: a branch of an
   * admin's sandbox is the admins' alone (ADMIN_ONLY_OWNER), not shared with every tenant.
   */
  branch(id: string, tag: string | undefined, wait: boolean, priv = false): Promise<BranchResult> {
    return branch(this.ctx, id, tag, wait, priv);
  }

  /** Exposes guest TCP port `port` of a running sandbox on the host (network-change.ts). */
  exposePort(id: string, port: number): Promise<ReadonlySandbox> {
    return exposePort(this.ctx, id, port);
  }

  /** Stops exposing guest TCP port `port` of a running sandbox. */
  unexposePort(id: string, port: number): Promise<ReadonlySandbox> {
    return unexposePort(this.ctx, id, port);
  }

  /** Replaces a running sandbox's egress policy. */
  setEgress(id: string, egress: Egress): Promise<ReadonlySandbox> {
    return setEgress(this.ctx, id, egress);
  }

  /** Sets (or with null clears) the idle timeout, counted from now; persisted with the record. */
  setIdleTimeout(id: string, timeoutMs: number | null): Promise<ReadonlySandbox> {
    return setIdleTimeout(this.ctx, id, timeoutMs);
  }

  /**
   * Sets (or with null clears) the absolute deadline of a running or paused sandbox, `ms` from
   * now; persisted with the record (sweeper.ts).
   */
  setDeadline(id: string, ms: number | null): Promise<ReadonlySandbox> {
    return setDeadline(this.ctx, id, ms);
  }

  /** Replaces E2B's settings of a running or paused sandbox (e2b-settings.ts). */
  setE2bSettings(id: string, e2b: E2bRecord): Promise<ReadonlySandbox> {
    return setE2bSettings(this.ctx, id, e2b);
  }

  /** Pre-started VMMs waiting, by snapshot tag. */
  poolStatus(): Record<string, number> {
    return this.ctx.pool.status();
  }

  /** The warm pool: totals, bounds, hot and cold members, per snapshot its target and demand. */
  poolState(): PoolState {
    return this.ctx.pool.state();
  }

  /** Which network modes this host gives, and its netns slots. */
  networkStatus(): ReturnType<NetworkService["status"]> {
    return this.ctx.net.status();
  }

  /** Running or paused sandboxes of `tag` plus children of it being forked right now. */
  countByTag(tag: string): number {
    return this.ctx.live.countByTag(tag);
  }

  /** Forks `n` children of snapshot `tag` in parallel (fork.ts). */
  fork(tag: string, n: number, opts: ForkOptions = {}): Promise<ForkResult> {
    return forkChildren(this.ctx, tag, n, opts);
  }

  /** Pauses a running sandbox (pause.ts). */
  pause(id: string): Promise<ReadonlySandbox> {
    return pause(this.ctx, id);
  }

  /** Resumes a paused sandbox (resume.ts), optionally with a new absolute deadline. */
  resume(id: string, opts?: ResumeOptions): Promise<ReadonlySandbox> {
    return resume(this.ctx, id, opts);
  }

  /** Kills a sandbox and forgets it (retire.ts). */
  kill(id: string): Promise<void> {
    return kill(this.ctx, id);
  }

  /** After a daemon restart: adopts, finishes or cleans up what the last one left (adopt.ts). */
  recover(): Promise<Recovered> {
    return recover(this.ctx);
  }

  /** Daemon shutdown: drop connections, leave the VMs running for the next daemon. */
  async detachAll(): Promise<void> {
    this.sweeper.stop();
    await detachAll(this.ctx);
  }

  async killAll(): Promise<void> {
    this.sweeper.stop();
    await killAll(this.ctx);
  }
}
