/**
 * The sandbox service: forks children from snapshots, keeps the live registry, kills them, and
 * re-adopts running children after a daemon restart. It is the one owner of sandbox state; the
 * API layer only calls it.
 */
import type { Cgroups, VmLimits } from "../host/cgroups.js";
import { mkdir, readdir, rm, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { AgentClient } from "../agent/client.js";
import { cloneOverlay } from "../disk/overlay.js";
import type { Snapshot, SnapshotStore } from "../snapshot/store.js";
import { fsyncDir, writeFileAtomic } from "../util/atomic.js";
import { NO_CRASH } from "../util/crash.js";
import type { CrashPoint } from "../util/crash.js";
import { Quarantine } from "../util/quarantine.js";
import { Strays } from "../vmm/strays.js";
import type { StrayProcess } from "../vmm/strays.js";
import { ForkdError, errorMessage } from "../util/errors.js";
import { assertSandboxId, assertTag, newSandboxId, SANDBOX_ID_RE } from "../util/ids.js";
import { branchSandbox, memoryFileOf } from "./branch.js";
import { nowMs, since, sleep } from "../util/time.js";
import { randomBytes } from "node:crypto";
import { guestNetOf, NetworkService } from "../net/service.js";
import type { Attachment, NetworkRecord } from "../net/service.js";
import { MAX_EXPOSE, NO_NETWORK } from "../net/policy.js";
import type { Egress, NetworkSpec } from "../net/policy.js";
import type { VmmDriver } from "../vmm/driver.js";
import { forkdMemsnap } from "../vmm/memsnap.js";
import type { MemoryDiffs } from "../vmm/memsnap.js";
import type { Vm } from "../vmm/vm.js";
import { endsAt, expiresAt, GUEST_DEFAULT_PIDS, settled, viewOf } from "./sandbox.js";
import type { PausedImage } from "./sandbox.js";
import { loadRecord, saveRecord } from "./record.js";
import {
  buildMemory,
  FANOUT_PREFIX,
  fanoutJournal,
  finishPause,
  pausedRecord,
  strayImages,
  unclaimedRecord,
  unpausedRecord,
} from "./recovery.js";
import { CommandTable } from "./commands.js";
import { WarmPool } from "./pool.js";
import type { Prepared } from "./pool.js";
import type { Sandbox, SandboxLimits, SandboxRecord, SandboxView } from "./sandbox.js";

import { MAX_FORK } from "./limits.js";
export { MAX_FORK };

export interface ForkFailure {
  index: number;
  code: string;
  message: string;
}

export interface ForkResult {
  sandboxes: SandboxView[];
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
}

/** Threads of one VMM process (QEMU: vCPUs, its I/O thread pool of up to 64, a few more). */
const VMM_TASKS = 256;

/**
 * The VMM cgroup's limits for a sandbox: its memory (default guest RAM + 384 MiB: all of its
 * RAM written, QEMU itself and its translation cache), a CPU quota if asked, and VMM_TASKS.
 */
export function limitsFor(machine: { memoryMiB: number }, asked: SandboxLimits = {}): VmLimits {
  const l: VmLimits = { memoryMiB: asked.memoryMiB ?? machine.memoryMiB + 384, pids: VMM_TASKS };
  if (asked.cpus !== undefined && asked.cpus !== null) l.cpus = asked.cpus;
  return l;
}

const DOING = { branch: "branched", pause: "paused", resume: "resumed" } as const;

/** Exited sandboxes stay listed (with why they exited) this long. */
const EXITED_RETENTION_MS = 10 * 60_000;
const SWEEP_MS = 1_000;

export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
}

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
  /** Host networking (absent: children can only have network none). */
  network?: NetworkService;
  /** Finds and kills VMMs a dead daemon left (default: QEMU and memsnap processes by path). */
  strays?: Strays;
  /** Where recovery moves records it cannot read (default: <root>/../quarantine). */
  quarantine?: Quarantine;
  /** Test-only fault injection (src/util/crash.ts). */
  crash?: CrashPoint;
}

/** How long DELETE waits for a pause, resume or branch in progress before it answers. */
const KILL_WAIT_MS = 60_000;

/** How long a child whose link is set up may take to see its carrier (the fork waits for it). */
const NET_UP_WAIT_MS = 2_000;

export class SandboxService {
  private readonly live = new Map<string, Sandbox>();
  private readonly pool: WarmPool;
  /** Children being forked right now (counted against maxSandboxes), in all and by tag. */
  private starting = 0;
  private readonly startingByTag = new Map<string, number>();

  private sweeper: NodeJS.Timeout | null = null;
  private readonly net: NetworkService;
  private readonly strays: Strays;
  private readonly quarantine: Quarantine;
  private readonly crash: CrashPoint;
  /** Pause and BRANCH save private memory pages with this (null: neither is available). */
  private readonly memory: MemoryDiffs | null;

  constructor(private readonly o: SandboxServiceOptions) {
    this.memory = o.memory ?? (o.memsnap ? forkdMemsnap(o.memsnap) : null);
    this.net = o.network ?? NetworkService.disabled(o.log);
    this.strays = o.strays ?? new Strays([o.driver.binary, ...(o.memsnap ? [o.memsnap] : [])], o.log);
    this.quarantine = o.quarantine ?? new Quarantine(join(dirname(o.root), "quarantine"), o.log);
    this.crash = o.crash ?? NO_CRASH;
    this.pool = new WarmPool(o.poolSize ?? 0, async (tag) => this.prepare(await o.store.get(tag)), o.log);
    this.sweeper = setInterval(() => void this.sweep(), SWEEP_MS);
    this.sweeper.unref();
  }

  private stopSweeper(): void {
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = null;
  }

  /**
   * Kills sandboxes past their lifetime (running or paused) or idle past their timeout; forgets
   * exited ones after a while.
   */
  private async sweep(): Promise<void> {
    const now = Date.now();
    for (const s of [...this.live.values()]) {
      const at = expiresAt(s);
      const end = endsAt(s);
      if (end !== null && now >= end && s.state !== "exited" && s.transition === null) {
        const ms = s.record.limits?.lifetimeMs ?? 0;
        this.o.log.info("sandbox lifetime over", { id: s.record.id, lifetime_ms: ms });
        await this.retire(s, `killed by the host: lifetime of ${ms / 1000} s over`, true);
      } else if (at !== null && s.busy === 0 && s.transition === null && now >= at) {
        this.o.log.info("sandbox idle timeout", {
          id: s.record.id,
          timeout_ms: s.record.timeoutMs,
          action: s.record.onIdle ?? "kill",
        });
        if (s.record.onIdle === "pause") {
          await this.pause(s.record.id).catch(async (e: unknown) => {
            this.o.log.warn("idle pause failed; killing", { id: s.record.id, error: errorMessage(e) });
            await this.retire(s, "idle timeout (pause failed)", true);
          });
        } else await this.retire(s, "idle timeout", true);
      } else if (s.state === "exited" && s.exitedAt !== null && now - s.exitedAt > EXITED_RETENTION_MS) {
        this.live.delete(s.record.id);
      }
    }
  }

  private notInTransition(s: Sandbox): void {
    if (s.transition)
      throw new ForkdError("conflict", `sandbox ${s.record.id} is being ${DOING[s.transition]} already`, {
        id: s.record.id,
      });
  }

  /**
   * Runs a branch, pause or resume of `s` (one at a time). A kill() while it runs marks `s`
   * doomed: it is retired as soon as the transition ends, whatever the outcome.
   */
  private async transit<T>(
    s: Sandbox,
    kind: "branch" | "pause" | "resume",
    fn: () => Promise<T>,
  ): Promise<T> {
    this.notInTransition(s);
    s.transition = kind;
    let settle = () => undefined as void;
    s.settling = new Promise<void>((r) => (settle = r));
    try {
      return await fn();
    } finally {
      s.transition = null;
      // Retired before kill() is released: its reply comes once the files are gone.
      if (s.doomed !== null) await this.retire(s, s.doomed, true).catch(() => undefined);
      s.settling = null;
      settle();
    }
  }

  /** Pre-starts VMMs for `tag` now, so its first fork is as fast as later ones. */
  prewarm(tag: string): void {
    this.pool.refill(tag);
  }

  /** Stops pre-starting VMMs for `tag` and kills those waiting (before its snapshot is deleted). */
  async forgetSnapshot(tag: string): Promise<void> {
    await this.pool.drain(tag);
  }

  list(): SandboxView[] {
    return [...this.live.values()].map(viewOf).sort((a, b) => a.created.localeCompare(b.created));
  }

  get(id: string): Sandbox {
    assertSandboxId(id);
    const s = this.live.get(id);
    if (!s) throw new ForkdError("not_found", `no sandbox ${id}`, { id });
    return s;
  }

  private running(id: string): Sandbox & { vm: Vm; agent: AgentClient } {
    const s = this.get(id);
    if (s.state !== "running" || !s.vm || !s.agent) {
      const why =
        s.transition === "pause"
          ? "being paused"
          : s.state === "paused"
            ? "paused; resume it first"
            : (s.exitReason ?? s.state);
      throw new ForkdError("conflict", `sandbox ${id} is not running (${why})`, { id, state: s.state });
    }
    return s as Sandbox & { vm: Vm; agent: AgentClient };
  }

  /**
   * The sandbox's agent for one API operation: the sandbox counts as in use (never idle) until
   * release() is called, and its idle timeout restarts then. `explain` turns a failure of the
   * operation into what the caller is told (see explain()).
   */
  lease(id: string): {
    agent: AgentClient;
    commands: CommandTable;
    release: () => void;
    explain: (e: unknown) => Promise<unknown>;
  } {
    const s = this.running(id);
    s.busy++;
    s.lastUsed = Date.now();
    let released = false;
    return {
      agent: s.agent,
      commands: s.commands,
      explain: (e) => this.explain(id, e),
      release: () => {
        if (released) return;
        released = true;
        s.busy--;
        s.lastUsed = Date.now();
      },
    };
  }

  /** Runs `fn` with the sandbox's agent, leased for its duration. */
  async use<T>(id: string, fn: (agent: AgentClient, commands: CommandTable) => Promise<T>): Promise<T> {
    const l = this.lease(id);
    try {
      return await fn(l.agent, l.commands);
    } catch (e) {
      throw await this.explain(id, e);
    } finally {
      l.release();
    }
  }

  /**
   * A call cut because its sandbox ended under it fails with `unavailable` and why it ended,
   * never with a bare lost connection: the host retired it (a kill, its lifetime, a limit: the
   * reason is recorded before its agent connection is closed, so it is known at once), or its
   * VMM died by itself (a memory limit, a crash: known once the daemon has seen the exit).
   */
  private async explain(id: string, e: unknown): Promise<unknown> {
    const s = this.live.get(id);
    if (!s || !(e instanceof ForkdError) || e.code !== "unavailable") return e;
    const retired = () => s.state === "exited";
    if (!retired()) {
      const vm = s.vm;
      if (!vm) return e;
      await vm.waitExit(1_000).catch(() => undefined);
      if (!vm.exited) return e;
      await vm.released;
      // onExit retires it once the jail has said why (the cgroup's verdict).
      for (let i = 0; i < 400 && !retired(); i++) await sleep(25);
    }
    return new ForkdError(
      "unavailable",
      `sandbox ${id} exited: ${s.exitReason ?? "vmm process exited"}`,
      { id, exit_reason: s.exitReason },
      e,
    );
  }

  /**
   * BRANCH: snapshots the running sandbox `id` as `tag` (see branch.ts). Returns once the source
   * runs again; with `wait`, once the snapshot is ready too.
   */
  async branch(
    id: string,
    tag: string | undefined,
    wait: boolean,
  ): Promise<{
    tag: string;
    status: "ready" | "writing";
    pauseMs: number;
    privateBytes: number;
    snapshot: Snapshot | null;
  }> {
    const s = this.running(id);
    const memsnap = this.memory;
    if (!memsnap) throw new ForkdError("unavailable", "branching needs native/memsnap/forkd-memsnap");
    this.notInTransition(s);
    const name = assertTag(tag ?? `br-${newSandboxId().slice(3, 15)}`);
    s.busy++;
    let started;
    try {
      started = await this.transit(s, "branch", async () => {
        const st = await branchSandbox(
          {
            store: this.o.store,
            memsnap,
            log: this.o.log,
            // Its writes now go to a new top layer: the limit counts the frozen one too.
            newTopLayer: () => this.armDiskLimit(s),
            crash: this.crash,
          },
          s,
          name,
        );
        // Counted before the transition ends: a kill() waiting on it keeps the files this reads.
        const finishing = st.done.then(
          () => undefined,
          () => undefined,
        );
        s.finishing.add(finishing);
        void finishing.then(() => s.finishing.delete(finishing));
        return st;
      });
    } finally {
      s.busy--;
      s.lastUsed = Date.now();
    }
    const base = { tag: name, pauseMs: started.pauseMs, privateBytes: started.privateBytes };
    if (!wait) return { ...base, status: "writing", snapshot: null };
    return { ...base, status: "ready", snapshot: await started.done };
  }

  /**
   * Exposes guest TCP port `port` of a running sandbox on the host (already exposed: nothing
   * changes); the view's network.ports says where it answers. Kept across pause and resume.
   */
  exposePort(id: string, port: number): Promise<SandboxView> {
    return this.changeNetwork(id, "port", "ports are exposed", async (net, rec, vm) => {
      if (rec.expose.includes(port)) return false;
      if (rec.expose.length >= MAX_EXPOSE)
        throw new ForkdError("resource_exhausted", `sandbox ${id} exposes ${MAX_EXPOSE} ports already`, {
          limit: MAX_EXPOSE,
        });
      await net.expose(port, vm);
      return true;
    });
  }

  /** Stops exposing guest TCP port `port` of a running sandbox (not exposed: nothing changes). */
  unexposePort(id: string, port: number): Promise<SandboxView> {
    return this.changeNetwork(id, "port", "ports are exposed", async (net, rec, vm) => {
      if (!rec.expose.includes(port)) return false;
      await net.unexpose(port, vm);
      return true;
    });
  }

  /**
   * Replaces a running sandbox's egress policy (mode netns, or user with egress allow or list):
   * the host's rules change in one transaction, and flows the old policy allowed are re-checked.
   * Kept across pause, resume and a daemon restart.
   */
  setEgress(id: string, egress: Egress): Promise<SandboxView> {
    return this.changeNetwork(id, "egress", "an egress policy is set", async (net) => {
      await net.setEgress(egress);
      return true;
    });
  }

  /**
   * Changes the network of a running sandbox (not while it is being paused, resumed or branched)
   * with `change`, which says whether it changed anything; the record is then written again.
   */
  private async changeNetwork(
    id: string,
    field: string,
    what: string,
    change: (net: Attachment, rec: NetworkRecord, vm: Vm) => Promise<boolean>,
  ): Promise<SandboxView> {
    const s = this.running(id);
    this.notInTransition(s);
    const net = s.net;
    const rec = s.record.network;
    if (!net || !rec || rec.mode === "none")
      throw new ForkdError(
        "invalid_argument",
        `sandbox ${id} has no network: ${what} on sandboxes created with network mode user or netns`,
        { id, field },
      );
    if (await change(net, rec, s.vm)) {
      s.record = { ...s.record, network: net.record() };
      await saveRecord(s.dir, s.record);
    }
    return viewOf(s);
  }

  /** Sets (or with null clears) the idle timeout, counted from now; persisted with the record. */
  async setIdleTimeout(id: string, timeoutMs: number | null): Promise<SandboxView> {
    const s = this.running(id);
    s.record = { ...s.record, timeoutMs };
    s.lastUsed = Date.now();
    await saveRecord(s.dir, s.record);
    return viewOf(s);
  }

  /** Pre-started VMMs waiting, by snapshot tag. */
  poolStatus(): Record<string, number> {
    return this.pool.status();
  }

  /** Which network modes this host gives, and its netns slots. */
  networkStatus(): ReturnType<NetworkService["status"]> {
    return this.net.status();
  }

  /** Running sandboxes of `tag` plus children of it being forked right now. */
  countByTag(tag: string): number {
    let n = this.startingByTag.get(tag) ?? 0;
    // A paused sandbox's disk still stacks on its snapshot's.
    for (const s of this.live.values()) if (s.record.tag === tag && s.state !== "exited") n++;
    return n;
  }

  /**
   * Forks `n` children of snapshot `tag` in parallel. Returns when every child has answered its
   * agent or failed; a failed child is cleaned up and reported without failing its siblings.
   */
  async fork(tag: string, n: number, opts: ForkOptions = {}): Promise<ForkResult> {
    if (!Number.isInteger(n) || n < 1 || n > MAX_FORK) {
      throw new ForkdError("invalid_argument", `n must be an integer in 1..${MAX_FORK}`, { field: "n" });
    }
    // A snapshot still being written (an async branch) is waited for, briefly; never half-read.
    const snap = await this.o.store.getReady(tag, this.o.writingWaitMs ?? 60_000);
    this.net.check(opts.network ?? NO_NETWORK, snap.meta.nic, tag);
    const max = this.o.maxSandboxes ?? 1000;
    const running = this.live.size + this.starting;
    if (running + n > max) {
      throw new ForkdError(
        "resource_exhausted",
        `forking ${n} would exceed the limit of ${max} sandboxes (${running} exist)`,
        {
          limit: max,
          existing: running,
        },
      );
    }
    this.starting += n;
    this.startingByTag.set(tag, (this.startingByTag.get(tag) ?? 0) + n);
    // Until the reply goes out, only this journal says who the children are for: a daemon that
    // dies first adopts them as unclaimed (recovery.ts). Written while the first VMMs start.
    const fanout = randomBytes(6).toString("hex");
    const journal = fanoutJournal(this.o.root, fanout);
    const journaled = writeFileAtomic(journal, `${new Date().toISOString()}\n`, 0o600);
    journaled.catch(() => undefined);
    // Bounded parallelism: starting every VMM at once makes them all contend and none finish
    // early; a few in flight per core keeps the CPU busy with less thrashing.
    const results = await settleWithLimit(n, this.o.forkParallelism ?? Infinity, () =>
      this.forkOne(snap, opts, { id: fanout, journaled }),
    ).finally(() => {
      this.starting -= n;
      const left = (this.startingByTag.get(tag) ?? n) - n;
      if (left > 0) this.startingByTag.set(tag, left);
      else this.startingByTag.delete(tag);
      this.pool.refill(snap.meta.tag);
    });
    const out: ForkResult = { sandboxes: [], failures: [] };
    results.forEach((r, index) => {
      if (r.status === "fulfilled") out.sandboxes.push(viewOf(r.value));
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
      this.o.log.warn("fork: some children failed", { tag, failed: out.failures.length, n });
    this.crash("fork:after-record");
    // The reply goes out now, naming every child: they are their client's.
    await rm(journal, { force: true })
      .then(() => fsyncDir(this.o.root))
      .catch((e: unknown) => this.o.log.warn("fork: journal not removed", { error: errorMessage(e) }));
    return out;
  }

  /**
   * Starts a VMM for a child of `snap`, waiting for device state (also used by the pool: there
   * `net` is absent, and a NIC gets no connectivity).
   */
  private async prepare(snap: Snapshot, net?: Attachment): Promise<Prepared> {
    const id = newSandboxId();
    const dir = join(this.o.root, id);
    const t0 = nowMs();
    let vm: Vm | null = null;
    try {
      await mkdir(dir, { mode: 0o700 });
      const disk = join(dir, "disk.qcow2");
      await cloneOverlay(snap.files.childDisk, disk);
      vm = await this.o.driver.launch(
        {
          dir,
          machine: snap.meta.machine,
          memory: { path: snap.files.memory, mode: "child" },
          disk,
          incoming: true,
          tbSizeMiB: this.o.tbSizeMiB,
          devicesOnlyState: snap.meta.stateFormat === "devices",
          nic: snap.meta.nic
            ? { guest: guestNetOf(snap.meta.nic), backend: net?.backend ?? { kind: "none" } }
            : undefined,
          netns: net?.netns,
          jail: await this.jailFor(snap, limitsFor(snap.meta.machine)),
        },
        { binary: net?.binary },
      );
      // Connect to the agent before the guest runs, so it never sees its host end closed.
      const agent = await vm.connectAgent(10_000);
      return { id, dir, vm, agent, launchMs: since(t0) };
    } catch (e) {
      await vm?.kill().catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
      throw e;
    }
  }

  /** What a VM of `snap` may see in its jail: its snapshot chain and its guest image (read-only). */
  private async jailFor(snap: Snapshot, limits: VmLimits): Promise<{ reads: string[]; limits: VmLimits }> {
    return { reads: [...(await this.o.store.chainDirs(snap)), snap.meta.image.dir], limits };
  }

  private async forkOne(
    snap: Snapshot,
    opts: ForkOptions,
    fanout: { id: string; journaled: Promise<void> },
  ): Promise<Sandbox> {
    const tag = snap.meta.tag;
    const nic = snap.meta.nic;
    const spec = opts.network ?? NO_NETWORK;
    const t0 = nowMs();
    // Pre-started VMMs have no network backend: they serve children without one.
    const pooled = spec.mode === "none" ? this.pool.take(tag) : null;
    let net: Attachment | null = null;
    let p: Prepared;
    try {
      net = await this.net.attach(spec, nic);
      p = pooled ?? (await this.prepare(snap, net));
    } catch (e) {
      await net?.release();
      if (pooled) {
        pooled.agent.close();
        await pooled.vm.kill().catch(() => undefined);
        await rm(pooled.dir, { recursive: true, force: true });
      }
      throw e;
    }
    const launchMs = since(t0);
    const limits = limitsFor(snap.meta.machine, opts.limits);
    try {
      // Pre-started with the defaults: the request's own limits are set before the guest runs.
      if (opts.limits && this.o.cgroups) await this.o.cgroups.apply(p.id, limits);
      const t1 = nowMs();
      await p.vm.restoreState(snap.files.vmstate);
      // The link as the snapshot saved it, unless this child wants the other state.
      if (nic && nic.linkUp !== net.linkUp) await p.vm.setLink(net.linkUp);
      await p.vm.resume();
      const restoreMs = since(t1);
      await p.agent.identity(
        {
          hostname: p.id,
          sandboxId: p.id,
          ...(typeof opts.limits?.pids === "number" ? { pidsMax: opts.limits.pids } : {}),
          netUpWaitMs: nic && net.linkUp ? NET_UP_WAIT_MS : undefined,
        },
        this.o.readyTimeoutMs ?? 60_000,
      );
      await net.start();
      const readyMs = since(t1);
      const record: SandboxRecord = {
        format: 1,
        id: p.id,
        tag,
        pid: p.vm.pid,
        pidStartTime: p.vm.id.startTime,
        created: new Date().toISOString(),
        timings: { launchMs, restoreMs, readyMs, totalMs: since(t0) },
        fromPool: pooled !== null,
        timeoutMs: opts.timeoutMs ?? null,
        metadata: opts.metadata ?? {},
        onIdle: opts.onIdle ?? "kill",
        owner: opts.owner ?? null,
        limits: {
          memoryMiB: this.o.cgroups && this.o.cgroups.mode !== "none" ? (limits.memoryMiB ?? null) : null,
          cpus: this.o.cgroups && this.o.cgroups.mode !== "none" ? (limits.cpus ?? null) : null,
          pids: opts.limits?.pids ?? GUEST_DEFAULT_PIDS,
          diskMiB: opts.limits?.diskMiB ?? null,
          lifetimeMs: opts.limits?.lifetimeMs ?? null,
        },
        network: net.record(),
        fanout: fanout.id,
      };
      await fanout.journaled;
      this.crash("fork:before-record");
      await saveRecord(p.dir, record);
      const s = this.register(record, p.dir, p.vm, p.agent, net);
      try {
        await this.armDiskLimit(s);
      } catch (e) {
        this.live.delete(record.id);
        await this.retire(s, "failed to start", true);
        throw e;
      }
      return s;
    } catch (e) {
      p.agent.close();
      await p.vm.kill().catch(() => undefined);
      await net.release();
      await rm(p.dir, { recursive: true, force: true });
      throw e;
    }
  }

  private register(
    record: SandboxRecord,
    dir: string,
    vm: Vm | null,
    agent: AgentClient | null,
    net: Attachment | null,
  ): Sandbox {
    const s: Sandbox = {
      record,
      dir,
      vm,
      agent,
      net,
      state: "running",
      exitReason: null,
      exitedAt: null,
      lastUsed: Date.now(),
      busy: 0,
      transition: null,
      settling: null,
      doomed: null,
      finishing: new Set(),
      commands: new CommandTable(),
    };
    this.live.set(record.id, s);
    vm?.onExit(() => {
      if (s.vm === vm) void this.onExit(s);
    });
    if (agent) this.watchAgent(s, agent);
    // Only a sandbox with a disk limit arms a threshold (armDiskLimit).
    if (record.limits?.diskMiB) vm?.onDiskWriteThreshold(() => void this.diskLimitHit(s, vm));
    return s;
  }

  /**
   * Holds what the sandbox wrote to disk (its own layers: the top one and those branches froze)
   * to `limits.diskMiB`: QEMU reports the first write to the top layer past what is left, and the
   * sandbox is killed with that reason. Re-armed whenever its top layer changes (a branch, a
   * resume) and after a daemon restart.
   */
  private async armDiskLimit(s: Sandbox): Promise<void> {
    const mib = s.record.limits?.diskMiB;
    const vm = s.vm;
    if (!mib || !vm || s.state !== "running") return;
    const { top, topNode, files } = await vm.diskLayers();
    let lower = 0;
    for (const f of files) if (f !== top && f.startsWith(s.dir + "/")) lower += (await stat(f)).size;
    const left = mib * 1024 * 1024 - lower;
    if (left <= (await stat(top)).size) await this.diskLimitHit(s, vm);
    else await vm.setWriteThreshold(topNode, left);
  }

  private async diskLimitHit(s: Sandbox, vm: Vm): Promise<void> {
    if (s.vm !== vm || s.state !== "running") return;
    const reason = `killed by the host: disk limit of ${s.record.limits?.diskMiB ?? "?"} MiB exceeded`;
    this.o.log.warn("sandbox exceeded its disk limit", { id: s.record.id, pid: s.record.pid });
    await this.retire(s, reason, true);
  }

  /**
   * A guest that keeps corrupting its agent channel (the client gave up reconnecting) cannot be
   * served: it is killed, and its exit reason says why.
   */
  private watchAgent(s: Sandbox, agent: AgentClient): void {
    agent.once("broken", (why: string) => {
      if (s.agent !== agent || s.state !== "running") return;
      const reason = `killed by the host: ${why}`;
      this.o.log.warn("sandbox agent channel broken", { id: s.record.id, reason });
      this.retire(s, reason, true).catch((e: unknown) =>
        this.o.log.warn("retire failed", { id: s.record.id, error: errorMessage(e) }),
      );
    });
  }

  /** A VM that exited without being asked: keep the record (with why), free its files. */
  private async onExit(s: Sandbox): Promise<void> {
    if (s.state !== "running") return;
    const v = await s.vm?.released;
    const reason = v?.oomKilled
      ? `killed by the host: memory limit of ${v.memoryLimitMiB ?? "?"} MiB exceeded`
      : "vmm process exited";
    this.o.log.warn("sandbox exited", { id: s.record.id, pid: s.record.pid, reason });
    await this.retire(s, reason, false);
  }

  /** Stops `s` for `reason`, frees its VMM and files; it stays listed as exited for a while. */
  private async retire(s: Sandbox, reason: string, kill: boolean): Promise<void> {
    if (s.state === "exited") return;
    s.state = "exited";
    s.exitReason = reason;
    s.exitedAt = Date.now();
    s.commands.clear();
    s.agent?.close();
    if (kill) await s.vm?.kill().catch(() => undefined);
    // Its VMM is gone: its slot can go to another child.
    await s.net?.release();
    s.net = null;
    // Its files go once any branch of it still being finished has read them.
    if (s.finishing.size > 0)
      void settled(s)
        .then(() => rm(s.dir, { recursive: true, force: true }))
        .catch(() => undefined);
    else await rm(s.dir, { recursive: true, force: true });
  }

  /**
   * Pauses a running sandbox: its whole state (memory, devices, disk) is saved in its own
   * directory and its VMM stops, freeing the memory. resume() brings it back with the same id,
   * files and processes, also after a daemon restart.
   *
   * Every instant is recoverable after kill -9 (recovery.ts): until the record is written the
   * VMM runs (paused) and is adopted as running; the record names the image (pending) before
   * the VMM stops, so a daemon that dies later finishes the image instead of losing it.
   */
  async pause(id: string): Promise<SandboxView> {
    const s = this.running(id);
    const memsnap = this.memory;
    if (!memsnap) throw new ForkdError("unavailable", "pausing needs native/memsnap/forkd-memsnap");
    return this.transit(s, "pause", () => this.pauseNow(s, s.vm, memsnap));
  }

  private async pauseNow(s: Sandbox, vm: Vm, memsnap: MemoryDiffs): Promise<SandboxView> {
    const id = s.record.id;
    const snap = await this.o.store.get(s.record.tag);
    const base = memoryFileOf(s, snap);
    const dir = join(s.dir, `paused-${Date.now().toString(36)}`);
    const diff = join(dir, "memory.diff");
    const before = s.record;
    let stopped = false;
    try {
      await mkdir(dir, { mode: 0o700 });
      const capture = await memsnap.capture(vm.pid, base, diff);
      let disk: string;
      try {
        await vm.pause();
        await vm.saveDevicesState(join(dir, "vmstate"));
        await capture.go();
        disk = await vm.diskTop();
        await capture.written;
      } catch (e) {
        capture.kill();
        throw e;
      }
      this.crash("pause:saved");
      const image: PausedImage = {
        pausedAt: new Date().toISOString(),
        memory: join(dir, "memory"),
        vmstate: join(dir, "vmstate"),
        disk,
        machine: snap.meta.machine,
        nic: snap.meta.nic
          ? { ...snap.meta.nic, linkUp: (s.record.network?.mode ?? "none") !== "none" }
          : undefined,
        pending: { diff, base },
      };
      // Written ahead, before the VMM stops: the saved state is never only in this process.
      s.record = { ...s.record, paused: image };
      await saveRecord(s.dir, s.record);
      this.crash("pause:recorded");
      // Detached from here: its VMM quitting is not an exit (onExit only acts on the current vm).
      const plain: Sandbox = s;
      plain.agent?.close();
      plain.vm = null;
      plain.agent = null;
      s.commands.clear();
      stopped = true;
      await vm.stop(); // quit: flushes and closes its disk
      this.crash("pause:after-stop");
      // Nothing runs: its slot and relays go back; resume() sets a network up again.
      await plain.net?.release();
      plain.net = null;
      if (s.doomed !== null) throw new ForkdError("conflict", `sandbox ${id} was killed while being paused`);
      await buildMemory(memsnap, base, diff, image.memory);
      this.crash("pause:before-record");
      // Its slot is given back; the network it asked for (and its host ports) comes back on resume.
      s.record = pausedRecord(s.record, image);
      await saveRecord(s.dir, s.record);
      s.state = "paused";
      // The previous paused image (if it was resumed from one) is no longer mapped by any VMM;
      // a branch still being finished may read it, so it goes once those settle.
      const old = before.memoryFile;
      if (old && old !== image.memory) {
        void settled(s)
          .then(() => rm(dirname(old), { recursive: true, force: true }))
          .catch(() => undefined);
      }
      this.o.log.info("sandbox paused", { id });
      return viewOf(s);
    } catch (e) {
      if (stopped) {
        // It was stopped but its image not finished: it cannot come back.
        await vm.kill().catch(() => undefined);
        await this.retire(s, `pause failed: ${errorMessage(e)}`, false);
      } else {
        // Never stopped: it runs on as it was.
        await vm.resume().catch(() => undefined);
        await rm(dir, { recursive: true, force: true });
        if (s.record !== before) {
          s.record = before;
          await saveRecord(s.dir, before).catch((w: unknown) =>
            this.o.log.warn("pause: record not restored", { id, error: errorMessage(w) }),
          );
        }
      }
      throw e;
    }
  }

  /**
   * Resumes a paused sandbox: same id, same files and processes, a corrected clock. The record
   * names the new VMM before its guest runs (the paused image is consistent with the disk until
   * then): a daemon that dies earlier kills that VMM and keeps the sandbox paused; later, the
   * next one adopts it as running.
   */
  async resume(id: string): Promise<SandboxView> {
    const s = this.get(id);
    this.notInTransition(s);
    const p = s.record.paused;
    if (s.state !== "paused" || !p) {
      throw new ForkdError("conflict", `sandbox ${id} is not paused (${s.state})`, { id, state: s.state });
    }
    return this.transit(s, "resume", () => this.resumeNow(s, p));
  }

  private async resumeNow(s: Sandbox, p: PausedImage): Promise<SandboxView> {
    const id = s.record.id;
    const before = s.record;
    let vm: Vm | null = null;
    let net: Attachment | null = null;
    try {
      const prior = s.record.network;
      const spec: NetworkSpec = prior
        ? { mode: prior.mode, egress: prior.egress, expose: prior.expose }
        : NO_NETWORK;
      net = await this.net.attach(spec, p.nic, prior);
      vm = await this.o.driver.launch(
        {
          dir: s.dir,
          machine: p.machine,
          memory: { path: p.memory, mode: "child" },
          disk: p.disk,
          incoming: true,
          tbSizeMiB: this.o.tbSizeMiB,
          devicesOnlyState: true,
          nic: p.nic ? { guest: guestNetOf(p.nic), backend: net.backend } : undefined,
          netns: net.netns,
          jail: await this.jailFor(
            await this.o.store.get(s.record.tag),
            limitsFor(p.machine, s.record.limits ?? {}),
          ),
        },
        { binary: net.binary },
      );
      const agent = await vm.connectAgent(10_000);
      await vm.restoreState(p.vmstate);
      if (p.nic && p.nic.linkUp !== net.linkUp) await vm.setLink(net.linkUp);
      this.crash("resume:launched");
      if (s.doomed !== null) throw new ForkdError("conflict", `sandbox ${id} was killed while being resumed`);
      const { paused: _p, ...rest } = s.record;
      const record = (): SandboxRecord => ({
        ...rest,
        pid: (vm as Vm).pid,
        pidStartTime: (vm as Vm).id.startTime,
        memoryFile: p.memory,
        network: (net as Attachment).record(),
      });
      s.record = record();
      await saveRecord(s.dir, s.record);
      this.crash("resume:recorded");
      await vm.resume();
      // Same identity; the clock has moved on (and the RNG is reseeded) while it was paused.
      await agent.identity(
        { hostname: id, sandboxId: id, netUpWaitMs: p.nic && net.linkUp ? NET_UP_WAIT_MS : undefined },
        this.o.readyTimeoutMs ?? 60_000,
      );
      await net.start();
      // Relays started: the host ports they answer on.
      const started = record();
      if (JSON.stringify(started.network) !== JSON.stringify(s.record.network)) {
        s.record = started;
        await saveRecord(s.dir, s.record);
      }
      s.vm = vm;
      s.agent = agent;
      this.watchAgent(s, agent);
      s.net = net;
      s.state = "running";
      s.lastUsed = Date.now();
      const running = vm;
      vm.onExit(() => {
        if (s.vm === running) void this.onExit(s);
      });
      if (s.record.limits?.diskMiB) vm.onDiskWriteThreshold(() => void this.diskLimitHit(s, running));
      await this.armDiskLimit(s);
      this.o.log.info("sandbox resumed", { id });
      return viewOf(s);
    } catch (e) {
      if (s.state === "running") {
        // Only its disk limit failed to arm: it does not run unlimited.
        await this.retire(s, `resume failed: ${errorMessage(e)}`, true);
      } else {
        await vm?.kill().catch(() => undefined);
        await net?.release();
        if (s.record !== before) {
          s.record = before;
          await saveRecord(s.dir, before).catch((w: unknown) =>
            this.o.log.warn("resume: record not restored", { id, error: errorMessage(w) }),
          );
        }
      }
      throw e;
    }
  }

  /**
   * Kills a sandbox asked to die (running, paused or already exited) and forgets it. During a
   * pause, resume or branch it is marked doomed and that transition's end retires it; this waits
   * for that (at most KILL_WAIT_MS), so the sandbox's files are gone when it returns.
   */
  async kill(id: string): Promise<void> {
    const s = this.get(id);
    this.live.delete(id);
    if (s.settling) {
      s.doomed = "killed";
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([s.settling, new Promise<void>((r) => (timer = setTimeout(r, KILL_WAIT_MS)))]);
      clearTimeout(timer);
      if (s.transition !== null) {
        this.o.log.warn("kill: the transition in progress retires the sandbox when it ends", {
          id,
          transition: s.transition,
        });
        return;
      }
    }
    await this.retire(s, "killed", true);
  }

  /**
   * After a daemon restart: re-adopt every sandbox whose VMM is still the process we started
   * (or that is paused), finish what the dead daemon left mid-way (recovery.ts), and clean up
   * the rest: a directory without a record (a fork not finished) is removed with whatever VMM
   * still uses it; a record that does not parse is quarantined with a log line.
   */
  async recover(): Promise<{ adopted: string[]; removed: string[]; quarantined: string[] }> {
    const adopted: string[] = [];
    const removed: string[] = [];
    const quarantined: string[] = [];
    await mkdir(this.o.root, { recursive: true, mode: 0o700 });
    const names = await readdir(this.o.root);
    const journals = new Set(
      names.filter((n) => n.startsWith(FANOUT_PREFIX)).map((n) => n.slice(FANOUT_PREFIX.length)),
    );
    // One look at /proc: nothing of this daemon's runs yet.
    const procs = await this.strays.list();
    for (const name of names) {
      const dir = join(this.o.root, name);
      if (!SANDBOX_ID_RE.test(name)) continue;
      const loaded = await loadRecord(dir, name);
      if (loaded.kind !== "ok") {
        // A VMM may still run without a usable record (the daemon died before writing it).
        await this.strays.kill([`${dir}/`], "a sandbox without a usable record", procs);
        if (loaded.kind === "missing") {
          this.o.log.warn("recover: removing a sandbox whose creation did not finish", { id: name });
          await rm(dir, { recursive: true, force: true });
          removed.push(name);
        } else {
          await this.quarantine.keep(dir, "sandbox", loaded.reason);
          quarantined.push(name);
        }
        continue;
      }
      const record = loaded.record;
      try {
        await this.adoptOne(dir, record, journals, procs);
        adopted.push(name);
      } catch (e) {
        // Registered before a later step failed: forgotten again, its connections closed.
        const half = this.live.get(name);
        if (half) {
          this.live.delete(name);
          half.state = "exited"; // its VMM's end below is not an exit to act on
          half.agent?.close();
          half.vm?.detach();
          await half.net?.release();
        }
        await this.strays.kill([`${dir}/`], "a sandbox that cannot be adopted", procs);
        if (record.paused) {
          // Its saved state is someone's work: kept aside, not deleted.
          await this.quarantine.keep(dir, "sandbox", `paused state unusable: ${errorMessage(e)}`);
          quarantined.push(name);
        } else {
          this.o.log.warn("recover: removing sandbox", { id: name, reason: errorMessage(e) });
          await rm(dir, { recursive: true, force: true });
          removed.push(name);
        }
      }
    }
    for (const j of journals) await rm(fanoutJournal(this.o.root, j), { force: true });
    return { adopted, removed, quarantined };
  }

  /** Adopts one sandbox with a parsed record (see recover()); throws when it cannot. */
  private async adoptOne(
    dir: string,
    found: SandboxRecord,
    journals: Set<string>,
    procs: StrayProcess[],
  ): Promise<void> {
    const id = found.id;
    let record = found;
    let dirty = false;
    if (record.fanout !== undefined && journals.has(record.fanout)) {
      // Its fork's reply was never sent: nobody may know its id.
      record = unclaimedRecord(record);
      dirty = true;
      this.o.log.warn("recover: adopting a sandbox whose fork reply was never sent", {
        id,
        idle_timeout_ms: record.timeoutMs,
      });
    }
    if (record.paused?.pending) {
      // A pause cut short: undone if its VMM still runs, else finished from what it saved.
      const running = unpausedRecord(record);
      const s = await this.adoptRunning(dir, running).catch((e: unknown) => {
        this.o.log.warn("recover: finishing a pause its daemon did not", { id, reason: errorMessage(e) });
        return null;
      });
      if (s) {
        await saveRecord(dir, running);
        await rm(dirname(record.paused.memory), { recursive: true, force: true });
        this.o.log.info("recover: a pause cut short was undone; the sandbox runs", { id });
        return;
      }
      await this.strays.kill([`${dir}/`], "the VMM of a pause cut short", procs);
      const old = record.memoryFile;
      record = await finishPause(this.memory, record);
      await saveRecord(dir, record);
      dirty = false;
      if (old && old !== record.paused?.memory) await rm(dirname(old), { recursive: true, force: true });
    }
    if (record.paused) {
      // Nothing may run from its files: a resume cut short left a VMM whose guest never ran.
      await this.strays.kill([`${dir}/`], "the VMM of a resume cut short", procs);
      if (dirty) await saveRecord(dir, record);
      this.register(record, dir, null, null, null).state = "paused";
    } else {
      await this.adoptRunning(dir, record);
      if (dirty) await saveRecord(dir, record);
    }
    for (const stray of await strayImages(dir, record)) await rm(stray, { recursive: true, force: true });
  }

  /**
   * Re-adopts the running VMM `record` names: reconnects its agent, resumes a guest a dead
   * daemon left paused (mid-pause, mid-branch, or resumed but not yet continued), takes its
   * network back. Registers it only once all of that worked.
   */
  private async adoptRunning(dir: string, record: SandboxRecord): Promise<Sandbox> {
    const id = record.id;
    const vm = await this.o.driver.adopt({ pid: record.pid, startTime: record.pidStartTime }, dir);
    if (!vm) throw new Error("VMM process is gone");
    let agent: AgentClient | null = null;
    try {
      agent = await vm.connectAgent(15_000);
      if ((await vm.status()) === "paused") {
        await vm.resume();
        await agent.identity({ hostname: id, sandboxId: id }, 15_000);
        this.o.log.info("recover: resumed a guest its daemon left paused", { id });
      } else await agent.ping(15_000);
    } catch (e) {
      agent?.close();
      vm.detach();
      throw e;
    }
    const net = record.network ? this.net.adopt(record.network) : null;
    const s = this.register(record, dir, vm, agent, net);
    // The threshold still holds in QEMU, but one crossed while no daemon listened went unheard.
    await this.armDiskLimit(s).catch((e: unknown) =>
      this.o.log.warn("recover: disk limit not armed", { id, error: errorMessage(e) }),
    );
    await net
      ?.start()
      .catch((e: unknown) =>
        this.o.log.warn("recover: exposed ports not relayed", { id, error: errorMessage(e) }),
      );
    return s;
  }

  /** Daemon shutdown: drop connections, leave the VMs running for the next daemon. */
  async detachAll(): Promise<void> {
    this.stopSweeper();
    await this.pool.close();
    for (const s of this.live.values()) {
      s.agent?.close();
      s.vm?.detach();
    }
  }

  async killAll(): Promise<void> {
    this.stopSweeper();
    await this.pool.close();
    await Promise.all([...this.live.keys()].map((id) => this.kill(id).catch(() => undefined)));
  }
}

/** Runs `n` tasks with at most `limit` in flight; results in task order, like allSettled. */
async function settleWithLimit<T>(
  n: number,
  limit: number,
  task: () => Promise<T>,
): Promise<PromiseSettledResult<T>[]> {
  const out: PromiseSettledResult<T>[] = new Array<PromiseSettledResult<T>>(n);
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const i = next++;
      try {
        out[i] = { status: "fulfilled", value: await task() };
      } catch (reason) {
        out[i] = { status: "rejected", reason };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, Math.max(1, limit)) }, worker));
  return out;
}
