/** The filter bar above the sandboxes list (a node filter when sandboxes name their nodes). */
import type { SandboxFilter } from "../lib/sandbox-filter";

/** A labelled choice of one of `choices`, or "any" (""). */
function AnyOf(p: { label: string; value: string; choices: string[]; onChange: (v: string) => void }) {
  return (
    <label>
      {p.label}
      <select value={p.value} onChange={(e) => p.onChange(e.currentTarget.value)}>
        <option value="">any</option>
        {p.choices.map((c) => (
          <option key={c} value={c}>
            {c}
          </option>
        ))}
      </select>
    </label>
  );
}

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
      <AnyOf
        label="Snapshot"
        value={f.snapshot}
        choices={p.snapshots}
        onChange={(snapshot) => p.onChange({ ...f, snapshot })}
      />
      {p.nodes.length > 0 && (
        <AnyOf
          label="Node"
          value={f.node}
          choices={p.nodes}
          onChange={(node) => p.onChange({ ...f, node })}
        />
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
