/** The sandboxes list's filters: by state, by snapshot, by node, and free text over id, snapshot, node and metadata. */
import type { Sandbox } from "../api/types.js";

export interface SandboxFilter {
  state: "" | Sandbox["state"];
  snapshot: string;
  /** A cluster node's id; "": any. */
  node: string;
  text: string;
}

export const NO_FILTER: SandboxFilter = { state: "", snapshot: "", node: "", text: "" };

export function matches(s: Sandbox, f: SandboxFilter): boolean {
  if (f.state !== "" && s.state !== f.state) return false;
  if (f.snapshot !== "" && s.tag !== f.snapshot) return false;
  if (f.node !== "" && s.node !== f.node) return false;
  const t = f.text.trim().toLowerCase();
  if (t === "") return true;
  const hay = [
    s.id,
    s.tag,
    s.network.mode,
    s.node ?? "",
    ...Object.entries(s.metadata).map(([k, v]) => `${k}=${v}`),
  ];
  return hay.some((h) => h.toLowerCase().includes(t));
}
