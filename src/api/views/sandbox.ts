/** A sandbox as the API shows it (schema Sandbox), from the sandbox service's domain sandbox. */
import type { z } from "zod";
import { endsAt, expiresAt } from "../../sandbox/index.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";
import type * as schemas from "../contract/schemas.js";
import { networkView } from "./network.js";

export type SandboxView = z.infer<typeof schemas.Sandbox>;

const isoOrNull = (at: number | null): string | null => (at === null ? null : new Date(at).toISOString());

/**
 * `names`: how the caller is shown the store key of its snapshot (src/app/scope.ts tagNames);
 * `node`: the cluster node this daemon is (null: alone).
 */
export const sandboxView = (
  s: ReadonlySandbox,
  names: (key: string) => string = (k) => k,
  node: string | null = null,
): SandboxView => ({
  id: s.record.id,
  tag: names(s.record.tag),
  pid: s.record.pid,
  state: s.state,
  created: s.record.created,
  exit_reason: s.exitReason,
  timings: {
    launch_ms: s.record.timings.launchMs,
    restore_ms: s.record.timings.restoreMs,
    ready_ms: s.record.timings.readyMs,
    total_ms: s.record.timings.totalMs,
  },
  from_pool: s.record.fromPool ?? false,
  timeout_ms: s.record.timeoutMs ?? null,
  expires_at: isoOrNull(expiresAt(s)),
  deadline: s.record.deadline ?? null,
  on_deadline: s.record.onDeadline ?? "kill",
  ends_at: isoOrNull(endsAt(s)),
  metadata: s.record.metadata ?? {},
  owner: s.record.owner ?? null,
  node,
  limits: {
    memory_mib: s.record.limits?.memoryMiB ?? null,
    cpus: s.record.limits?.cpus ?? null,
    pids: s.record.limits?.pids ?? null,
    disk_mib: s.record.limits?.diskMiB ?? null,
    lifetime_ms: s.record.limits?.lifetimeMs ?? null,
  },
  network: networkView(s.record.network, s.state === "running"),
});
