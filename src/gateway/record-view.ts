/**
 * A sandbox as its etcd record knows it (sandboxes/<id>), in the REST API's Sandbox shape: for a
 * sandbox no node answers for (`lost`, or one whose node is gone), in listings and GET
 * /v1/sandboxes/{id}. What only its node knew (its pid, timings, metadata, limits, network) is
 * empty; `node` says where it ran, `exit_reason` why it is lost.
 */
import type { SandboxLocation } from "../cluster/index.js";

export function recordView(r: SandboxLocation, names: (key: string) => string): Record<string, unknown> {
  return {
    id: r.id,
    tag: names(r.tag),
    pid: 0,
    state: r.state,
    created: r.created,
    exit_reason: r.reason,
    timings: { launch_ms: 0, restore_ms: 0, ready_ms: 0, total_ms: 0 },
    from_pool: false,
    timeout_ms: null,
    expires_at: null,
    deadline: null,
    on_deadline: "kill",
    ends_at: null,
    metadata: {},
    owner: r.owner,
    limits: { memory_mib: null, cpus: null, pids: null, disk_mib: null, lifetime_ms: null },
    network: { mode: "none", guest_ip: null, egress: null, ports: [] },
    node: r.node,
  };
}
