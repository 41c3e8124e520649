/**
 * Where a call to one sandbox goes (pure; docs/cluster.md, "Failure model"): its record
 * (sandboxes/<id>) names its node, whose record names its address. A sandbox without a record,
 * or not the caller's (a tenant sees its own only: the same answer, so ids do not leak), does
 * not exist; one whose record says `lost` is answered from the record; one whose node is not in
 * the cluster (gone, and not marked yet) is unavailable; else the call goes to its node.
 */
import type { Caller } from "../access/index.js";
import { mayHold } from "../app/index.js";
import type { NodeRecord, SandboxLocation } from "../cluster/index.js";

export type SandboxRoute =
  | { kind: "node"; node: NodeRecord; record: SandboxLocation }
  | { kind: "lost"; record: SandboxLocation }
  | { kind: "absent"; record: SandboxLocation }
  | { kind: "none" };

export function routeSandbox(
  record: SandboxLocation | null,
  caller: Caller,
  nodeOf: (id: string) => NodeRecord | undefined,
): SandboxRoute {
  if (!record || !mayHold(caller, record.owner)) return { kind: "none" };
  if (record.state === "lost") return { kind: "lost", record };
  const node = nodeOf(record.node);
  return node ? { kind: "node", node, record } : { kind: "absent", record };
}
