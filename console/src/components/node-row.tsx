/** One row of the nodes list (cards on a phone: each cell names its column). */
import type { ClusterNode } from "../api/types";
import { freeSlots, nodeState } from "../lib/cluster-nodes";
import { age, bytes } from "../lib/format";

const MIB = 1024 * 1024;

export function NodeRow({ n, now }: { n: ClusterNode; now: number }) {
  const c = n.capacity;
  const state = nodeState(n);
  return (
    <tr aria-label={`Node ${n.id}`}>
      <th scope="row" data-label="Node">
        {n.id}
      </th>
      <td data-label="State">
        <span class={`pill ${state}`}>{state}</span>
      </td>
      <td data-label="Address">
        {n.api}
        {n.e2b && <div class="sub">E2B {n.e2b}</div>}
      </td>
      <td data-label="Machine">
        {n.machine.accel}, QEMU {n.machine.qemu}, CPU {n.machine.cpu}
      </td>
      <td data-label="Cores">{c.cores}</td>
      <td data-label="Memory">
        {bytes(c.free_memory_mib * MIB)} free of {bytes(c.memory_mib * MIB)}
      </td>
      <td data-label="Sandboxes">
        {c.running} running, {c.paused} paused
      </td>
      <td data-label="Free slots">
        {freeSlots(n)} of {c.max_sandboxes}
      </td>
      <td data-label="Snapshots held">
        {n.holds.length === 0 ? (
          "none"
        ) : (
          <details>
            <summary>{n.holds.length === 1 ? "1 snapshot" : `${n.holds.length} snapshots`}</summary>
            <ul class="held">
              {n.holds.map((h) => (
                <li key={h.tag}>
                  {h.tag}
                  {h.warm > 0 ? ` (${h.warm} warm)` : ""}
                </li>
              ))}
            </ul>
          </details>
        )}
      </td>
      <td data-label="Version">{n.version}</td>
      <td data-label="Up">{age(n.started, now)}</td>
    </tr>
  );
}
