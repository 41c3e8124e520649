/** The filter bar above the sandboxes list (a node filter when sandboxes name their nodes). */
import type { SandboxFilter } from "../lib/sandbox-filter";

export function SandboxFilters(p: {
  filter: SandboxFilter;
  snapshots: string[];
  /** The nodes the sandboxes run on (none: one daemon, no node filter). */
  nodes: string[];
  onChange: (f: SandboxFilter) => void;
}) {
  const f = p.filter;
  return (
    <form class="filters" role="search" aria-label="Filter sandboxes" onSubmit={(e) => e.preventDefault()}>
      <label>
        State
        <select
          value={f.state}
          onChange={(e) => p.onChange({ ...f, state: e.currentTarget.value as SandboxFilter["state"] })}
        >
          <option value="">any</option>
          <option value="running">running</option>
          <option value="paused">paused</option>
          <option value="exited">exited</option>
          <option value="lost">lost</option>
        </select>
      </label>
      <label>
        Snapshot
        <select value={f.snapshot} onChange={(e) => p.onChange({ ...f, snapshot: e.currentTarget.value })}>
          <option value="">any</option>
          {p.snapshots.map((t) => (
            <option key={t} value={t}>
              {t}
            </option>
          ))}
        </select>
      </label>
      {p.nodes.length > 0 && (
        <label>
          Node
          <select value={f.node} onChange={(e) => p.onChange({ ...f, node: e.currentTarget.value })}>
            <option value="">any</option>
            {p.nodes.map((n) => (
              <option key={n} value={n}>
                {n}
              </option>
            ))}
          </select>
        </label>
      )}
      <label>
        Search
        <input
          type="search"
          value={f.text}
          placeholder="id, metadata"
          onInput={(e) => p.onChange({ ...f, text: e.currentTarget.value })}
        />
      </label>
    </form>
  );
}
