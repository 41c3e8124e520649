/** A live sandbox: its persisted record, its VMM process and its agent connection. */
import type { AgentClient } from "../agent/client.js";
import type { QemuVm } from "../vmm/qemu.js";

export type SandboxState = "running" | "exited";

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
}

export interface Sandbox {
  record: SandboxRecord;
  dir: string;
  vm: QemuVm;
  agent: AgentClient;
  state: SandboxState;
  /** Why it stopped running, when it did without being asked. */
  exitReason: string | null;
}

export interface SandboxView {
  id: string;
  tag: string;
  pid: number;
  state: SandboxState;
  created: string;
  exit_reason: string | null;
  timings: SandboxRecord["timings"];
  from_pool: boolean;
}

export const viewOf = (s: Sandbox): SandboxView => ({
  id: s.record.id,
  tag: s.record.tag,
  pid: s.record.pid,
  state: s.state,
  created: s.record.created,
  exit_reason: s.exitReason,
  timings: s.record.timings,
  from_pool: s.record.fromPool ?? false,
});
