/**
 * SNAPSHOT OPERATIONS AS A CALLER: what a caller is shown of the snapshots (list, one by its
 * tag, ready or still being written) and what it may delete: a tenant its own (ready or failed),
 * never a shared one (forbidden) nor a reserved tag (forbidden, existing or not); an admin any.
 * Tags are named in the caller's namespace (./scope.ts, src/snapshot/namespace.ts). The REST
 * API's /v1/snapshots and E2B's /snapshots and DELETE /templates/{id}.
 */
import { isAdmin } from "../access/index.js";
import type { Caller } from "../access/index.js";
import type { DeletePlan } from "../snapshot/index.js";
import type { SnapshotMeta } from "../snapshot/index.js";
import { splitKey } from "../snapshot/index.js";
import type { SnapshotPending } from "../snapshot/index.js";
import { ForkdError } from "../util/index.js";
import {
  canChange,
  mayHold,
  noSnapshot,
  reserved,
  snapshotKey,
  visibleMetas,
  visiblePending,
  visibleSnapshot,
} from "./scope.js";
import type { Services } from "./services.js";

/** The snapshots the caller is shown, ready and being written. */
export async function snapshotsOf(
  s: Services,
  caller: Caller,
): Promise<{ snapshots: SnapshotMeta[]; pending: SnapshotPending[] }> {
  const all = await s.snapshots.list();
  return { snapshots: visibleMetas(caller, all.snapshots), pending: visiblePending(caller, all.pending) };
}

/** The caller's snapshot `tag`: ready (its metadata), or being written or failed (its pending record). */
export async function snapshotAs(
  s: Services,
  caller: Caller,
  tag: string,
): Promise<{ meta: SnapshotMeta } | { pending: SnapshotPending }> {
  const key = await snapshotKey(s, caller, tag);
  if (!(await s.snapshots.has(key))) {
    const pending = await s.snapshots.pending(key);
    if (!pending) throw noSnapshot(tag);
    return { pending };
  }
  return { meta: (await visibleSnapshot(s, caller, tag)).meta };
}

/** The store key of snapshot `tag` if the caller may delete it. */
export async function deletableKey(s: Services, caller: Caller, tag: string): Promise<string> {
  if (isAdmin(caller)) return tag;
  if (s.snapshots.namespaces.isReserved(splitKey(tag).name)) throw reserved(tag);
  const key = await snapshotKey(s, caller, tag);
  // A failed or ready one of its own (a shared one: refused, as it is not the caller's to change).
  const owner = (await s.snapshots.lookup(key))?.owner;
  if (!canChange(caller, owner))
    throw new ForkdError("forbidden", `snapshot ${tag} is shared; only an admin may change it`, { tag });
  return key;
}

export interface DeleteOptions {
  cascade: boolean;
  force: boolean;
}

/** Deletes the caller's snapshot `tag` (store keys in the result). */
export async function deleteSnapshotAs(
  s: Services,
  caller: Caller,
  tag: string,
  o: DeleteOptions,
): Promise<{ cascaded?: string[]; orphaned?: string[] }> {
  return s.snapshots.delete(await deletableKey(s, caller, tag), o);
}

/** What deleting the caller's snapshot `tag` would do, and which of its sandboxes stand in the way. */
export async function planDeleteAs(
  s: Services,
  caller: Caller,
  tag: string,
  o: DeleteOptions,
): Promise<{ plan: DeletePlan; sandboxes: string[] }> {
  const plan = await s.snapshots.planDelete(await deletableKey(s, caller, tag), o);
  const inUse = new Set(plan.inUse);
  const sandboxes = s.sandboxes
    .list()
    .filter((sb) => inUse.has(sb.record.tag) && mayHold(caller, sb.record.owner))
    .map((sb) => sb.record.id);
  return { plan, sandboxes };
}
