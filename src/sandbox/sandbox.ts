/** A live sandbox: its persisted record, its VMM process and its agent connection. */
import type { AgentClient } from "../agent/index.js";
import type { Attachment, NetworkRecord } from "../net/index.js";
import type { NicMeta } from "../snapshot/index.js";
import type { Vm } from "../vmm/index.js";
import { CommandTable } from "./commands/table.js";

export type SandboxState = "running" | "paused" | "exited";

/** What survives a daemon restart (<data>/sandboxes/<id>/sandbox.json). */
export interface SandboxRecord {
  format: 1;
  id: string;
  tag: string;
  pid: number;
  /** /proc start time of pid, so a reused pid is never mistaken for our VM. */
  pidStartTime: number;
  created: string;
  timings: { launchMs: number; restoreMs: number; readyMs: number; totalMs: number };
  /** Its VMM was pre-started by the pool (launchMs is then only the hand-over). */
  fromPool: boolean;
  /**
   * Its VMM was a hot pool member (restored, warmed and stopped ahead: pool-warm.ts): restoreMs
   * is then only its continue, readyMs that and its identity. Absent: not hot.
   */
  hotPool?: boolean;
  /** Idle timeout (absent in records written before it existed). */
  timeoutMs?: number | null;
  metadata?: Record<string, string>;
  /** What the idle timeout does: kill (default) or pause. */
  onIdle?: "kill" | "pause";
  /** Limits in force; absent for sandboxes of a daemon that had none. */
  limits?: SandboxLimits;
  /** The memory file its VMM maps when it is not its snapshot's (after a resume). */
  memoryFile?: string;
  /** Set while paused: what resume() starts it from. */
  paused?: PausedImage;
  /** The tenant whose token created it (null or absent: an admin). */
  owner?: string | null;
  /** Its network (absent in records written before networking: none). */
  network?: NetworkRecord;
  /**
   * The fan-out that created it, while that fork's reply has not been sent (its journal file
   * <sandboxes>/.fanout-<id> exists): a daemon that died first adopts it as unclaimed.
   */
  fanout?: string;
  /**
   * Sandbox-wide environment (E2B's `envVars`, the REST API's `env`): every command and cell of
   * the sandbox sees it, under its own request's env.
   */
  env?: Record<string, string>;
  /**
   * An absolute timeout (ISO time; null or absent: none): when it comes, the sweeper does
   * `onDeadline` to the running sandbox, in use or idle (E2B's timeout).
   */
  deadline?: string | null;
  /** What the deadline does: kill (default) or pause. */
  onDeadline?: "kill" | "pause";
  /** What only E2B's API (src/e2b) keeps of a sandbox it created. */
  e2b?: E2bRecord;
}

/** E2B's settings of a sandbox created through its API. */
export interface E2bRecord {
  /** Created `secure`: the sandbox plane asks for its envd access token (src/e2b/auth.ts). */
  secure: boolean;
  /** Paused, it resumes when the sandbox plane is asked for it. */
  autoResume?: boolean;
  /** The timeout it was created with (ms): an auto-resume sets its deadline that far again. */
  timeoutMs?: number;
  /** What was asked, echoed by its info (null: not asked). */
  allowInternetAccess?: boolean | null;
  network?: { allowOut?: string[]; denyOut?: string[] };
}

/** A paused sandbox's saved state (files in its own directory). */
export interface PausedImage {
  pausedAt: string;
  memory: string;
  vmstate: string;
  /** The top layer of its disk chain. */
  disk: string;
  machine: { memoryMiB: number; vcpus: number; accel: "kvm" | "tcg"; cpu: string };
  /** Its network device, as saved (absent: it has none). */
  nic?: NicMeta;
  /**
   * Set while the pause is being finished: the memory image is still to be built from `base`
   * (the memory file its VMM mapped) and `diff` (its private pages). A daemon that died then
   * finishes it at recovery (or adopts the VMM as running if it still runs).
   */
  pending?: { diff: string; base: string };
}

export interface Sandbox {
  record: SandboxRecord;
  dir: string;
  /** Its VMM and agent connection; null while paused (no process). */
  vm: Vm | null;
  agent: AgentClient | null;
  /** Its network on the host while its VMM runs (slot, relays); null otherwise. */
  net: Attachment | null;
  state: SandboxState;
  /** Why it stopped running, when it did without being asked. */
  exitReason: string | null;
  /** When it stopped running (ms since the epoch); exited sandboxes are listed for a while. */
  exitedAt: number | null;
  /** Last API use (ms since the epoch): the idle timeout counts from here. */
  lastUsed: number;
  /** API operations in flight: a sandbox in use is never idle. */
  busy: number;
  /** A branch, pause or resume of it in progress (one at a time: each drives its VMM over QMP). */
  transition: "branch" | "pause" | "resume" | null;
  /** Settles when the transition in progress has (null: none). */
  settling: Promise<void> | null;
  /** Killed during a transition: retired as soon as the transition ends. */
  doomed: string | null;
  /**
   * Branches still being finished in the background: they read this sandbox's memory image and
   * disk layers, so neither is removed (by a later pause, or by kill) until these settle.
   */
  finishing: Set<Promise<unknown>>;
  commands: CommandTable;
  /** Tells the daemon's event bus that its state changed (set by the registry: registry.ts). */
  changed?: () => void;
}

/** Waits for every background branch finish of `s` (failed or not). */
export async function settled(s: Sandbox): Promise<void> {
  while (s.finishing.size > 0) await Promise.allSettled([...s.finishing]);
}

/** What a request may limit (guest vCPUs and RAM come from the snapshot). */
export interface SandboxLimits {
  /** Host memory of its VMM process (null: not limited, the host has no cgroups). */
  memoryMiB?: number | null;
  /** CPU quota of its VMM process, in cores. */
  cpus?: number | null;
  /** Processes of its guest workload (commands, the interpreter, and all they start). */
  pids?: number | null;
  /** Host disk its own disk layers may take (what it wrote since the fork; null: unbounded). */
  diskMiB?: number | null;
  /** Killed this long after its creation, in use, idle or paused (null: no lifetime). */
  lifetimeMs?: number | null;
}

/**
 * A sandbox as it enters the registry: running on `vm` (unless the caller marks it otherwise),
 * just used, not busy, nothing in transition, no commands yet.
 */
export function newSandbox(
  record: SandboxRecord,
  dir: string,
  vm: Vm | null,
  agent: AgentClient | null,
  net: Attachment | null,
): Sandbox {
  if (agent) agent.defaultEnv = record.env ?? {};
  return {
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
}

/** The guest's own workload pids.max when the request sets none (guest/agent/src/limits.c). */
export const GUEST_DEFAULT_PIDS = 1024;

/** When its lifetime ends and the host kills `s` (null: it has none). */
export function endsAt(s: Sandbox): number | null {
  const l = s.record.limits?.lifetimeMs ?? null;
  return l === null ? null : Date.parse(s.record.created) + l;
}

/** When its absolute timeout (record.deadline) comes, while it runs (null: it has none). */
export function deadlineOf(s: Sandbox): number | null {
  const d = s.record.deadline ?? null;
  return d === null ? null : Date.parse(d);
}

/** When the idle timeout kills `s` if nothing uses it first (null: never, or in use now). */
export function expiresAt(s: Sandbox): number | null {
  const t = s.record.timeoutMs ?? null;
  if (t === null || s.state !== "running") return null;
  return s.lastUsed + t;
}

/** What a caller outside the sandbox service is given: a sandbox to read, not to change. */
export type ReadonlySandbox = Readonly<Sandbox>;

/** Marks `s` running on `vm`, with its agent connection and network (a fork, a resume, an adoption). */
export function markRunning(s: Sandbox, vm: Vm, agent: AgentClient, net: Attachment | null): void {
  agent.defaultEnv = s.record.env ?? {};
  s.vm = vm;
  s.agent = agent;
  s.net = net;
  s.state = "running";
  s.lastUsed = Date.now();
  s.changed?.();
}

/** Marks `s` paused: no VMM, agent connection nor network of its own any more (they are gone). */
export function markPaused(s: Sandbox): void {
  s.vm = null;
  s.agent = null;
  s.net = null;
  s.state = "paused";
  s.changed?.();
}

/**
 * Marks `s` exited for `reason` (false: it was already, nothing changes). Its VMM, agent
 * connection and network are for the caller to end; it stays listed as exited for a while.
 */
export function markExited(s: Sandbox, reason: string): boolean {
  if (s.state === "exited") return false;
  s.state = "exited";
  s.exitReason = reason;
  s.exitedAt = Date.now();
  s.changed?.();
  return true;
}
