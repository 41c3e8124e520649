/**
 * What a running VM offers the sandbox and snapshot services, whatever runs it (QEMU in
 * production: qemu.ts; a fake in unit tests: test/fakes/vmm.ts). Composed of small parts, each
 * one mechanism; `Vm` is all of them. test/contract/vmm.ts is the contract every implementation
 * passes.
 */
import type { AgentClient } from "../agent/index.js";

/** What the VM's cgroup says about its end (see Cgroups.verdict). */
export interface ExitVerdict {
  oomKilled: boolean;
  memoryLimitMiB: number | null;
}

export interface VmIdentity {
  pid: number;
  /** /proc start time of `pid`; guards against pid reuse when adopting. */
  startTime: number;
}

/** The VMM process: who it is, and its end. */
export interface VmProcess {
  readonly id: VmIdentity;
  readonly pid: number;
  /** Directory of its sockets and logs (VmLaunch.dir). */
  readonly dir: string;
  /** The jailed VMM's uid and gid: files it must open (a new disk layer) are given to it. */
  readonly owner: { uid: number; gid: number } | null;
  readonly exited: boolean;
  /** Resolves once the process is gone and its jail released, with why it ended. */
  readonly released: Promise<ExitVerdict>;
  /** Calls `fn` once when the process exits (at once if it already has). */
  onExit(fn: () => void): void;
  /** Resolves when the process has exited, or rejects (`timeout`) after `timeoutMs`. */
  waitExit(timeoutMs: number): Promise<void>;
  /** Asks the VMM to quit; killed if it does not within `graceMs`. */
  stop(graceMs?: number): Promise<void>;
  kill(): Promise<void>;
  /** Drops the daemon's control connection; the process runs on (a later daemon adopts it). */
  detach(): void;
}

/** Its guest's vCPUs. */
export interface VmRunState {
  /** "running", "paused", "inmigrate" (waiting for state), "postmigrate" (state saved), ... */
  status(): Promise<string>;
  pause(): Promise<void>;
  resume(): Promise<void>;
}

/** Its state as files: saved by one VM, loaded by a new process. */
export interface VmSnapshotting {
  /** Stops the VM and writes its device state (RAM is the shared memory file). */
  saveState(file: string, timeoutMs?: number): Promise<void>;
  /** Writes the device state without RAM (paused VM); loaded with `devicesOnlyState`. */
  saveDevicesState(file: string): Promise<void>;
  /** Loads saved state into a VM launched with `incoming`; it stays paused. */
  restoreState(file: string, timeoutMs?: number): Promise<void>;
}

/**
 * A live copy of its RAM (a live BRANCH: src/vmm/live-capture.ts): QEMU's precopy migration into
 * a stream while the guest runs, which stops the guest at the switchover and waits there, so the
 * disk and device state can be taken at that same instant before the last pages are sent.
 */
export interface VmMigration {
  /** Starts sending RAM to `uri` (`unix:PATH`); the guest runs until the switchover. */
  migrateRam(uri: string): Promise<void>;
  /** Resolves once the guest is stopped at the switchover; rejects if the migration ended. */
  migrationStopped(timeoutMs: number): Promise<void>;
  /** Stopped at the switchover: sends the last pages; resolves once done (the guest still stopped). */
  migrationFinish(timeoutMs: number): Promise<void>;
  /** Ends a migration in progress, if any (a guest it stopped runs again). */
  migrationCancel(timeoutMs: number): Promise<void>;
}

/** Its disk: a chain of qcow2 layers whose top one it writes. */
export interface VmDisk {
  /** The file of the disk's current top layer. */
  diskTop(): Promise<string>;
  /** The top layer's file and node name, and the files of every layer. */
  diskLayers(): Promise<{ top: string; topNode: string; files: string[] }>;
  /** Paused VM: writes go to `newTop` (an empty layer over the current top). Returns the old top. */
  freezeDisk(newTop: string): Promise<string>;
  /** The first write past `offset` bytes of `node`'s file calls the onDiskWriteThreshold handlers. */
  setWriteThreshold(node: string, offset: number): Promise<void>;
  onDiskWriteThreshold(fn: () => void): void;
}

/** Its network device. */
export interface VmNic {
  /** The guest NIC's carrier; a paused VM's guest sees the change when it runs. */
  setLink(up: boolean): Promise<void>;
  /** User-mode forwards: `tcp:HOSTADDR:HOSTPORT-GUESTADDR:GUESTPORT`. */
  hostfwdAdd(rule: string): Promise<void>;
  /** `tcp:HOSTADDR:HOSTPORT`; one already gone is no error. */
  hostfwdRemove(rule: string): Promise<void>;
}

/** The guest agent's channel. */
export interface VmAgentPort {
  /**
   * Connects to the guest agent's channel (retrying while the VMM starts). Connect before the
   * guest runs, so it never sees the host end closed.
   */
  connectAgent(timeoutMs: number, signal?: AbortSignal): Promise<AgentClient>;
}

export interface Vm extends VmProcess, VmRunState, VmSnapshotting, VmMigration, VmDisk, VmNic, VmAgentPort {}
