/** One row of the sandboxes list (cards on a phone: each cell names its column); its node in a cluster. */
import type { Sandbox, Usage } from "../api/types";
import { age, bytes } from "../lib/format";
import { hrefOf } from "../lib/route";
import type { Action } from "../lib/use-action";
import { limitsText } from "./limits-text";
import { SandboxActions } from "./sandbox-actions";

export function SandboxRow(p: {
  s: Sandbox;
  usage: Usage | undefined;
  now: number;
  action: Action;
  /** The Node column (shown when any sandbox names its node). */
  showNode: boolean;
}) {
  const { s, usage } = p;
  return (
    <tr aria-label={`Sandbox ${s.id}`}>
      <th scope="row" data-label="Sandbox">
        <a href={hrefOf({ page: "sandbox", id: s.id })}>{s.id}</a>
      </th>
      <td data-label="State">
        <span class={`pill ${s.state}`}>{s.state}</span>
      </td>
      <td data-label="Snapshot">
        <a href={hrefOf({ page: "snapshots", tag: s.tag })}>{s.tag}</a>
      </td>
      {p.showNode && <td data-label="Node">{s.node ?? "—"}</td>}
      <td data-label="Age">{age(s.created, p.now)}</td>
      <td data-label="CPU">{usage ? `${usage.cpu_percent.toFixed(1)}%` : "—"}</td>
      <td data-label="Memory">{usage ? bytes(usage.memory_bytes) : "—"}</td>
      <td data-label="Network">{s.network.mode}</td>
      <td data-label="Limits">{limitsText(s.limits)}</td>
      <td data-label="Exit reason">{s.exit_reason ?? "—"}</td>
      <td data-label="Actions">
        <SandboxActions s={s} action={p.action} />
      </td>
    </tr>
  );
}
