/**
 * Tenant scoping. An admin caller (the unix socket, FORKD_TOKEN, an admin-scoped token) sees
 * everything. A tenant's caller sees:
 *   - sandboxes: its own only. Another tenant's sandbox is "not found", exactly as a sandbox that
 *     does not exist, so ids do not leak;
 *   - snapshots: those of its own namespace, and shared ones (owner null: made by an admin),
 *     which it may fork, read and pack but not change. Every tag a request names is resolved
 *     here, in the caller's namespace (src/snapshot/namespace.ts), and every tag a reply shows
 *     is named here for it: another tenant's snapshot does not exist for it, and a tag it
 *     creates never meets another tenant's.
 * Every front door scopes through here (the REST API's guard of /v1/sandboxes/{id}, E2B's
 * control plane, the use cases of this folder).
 */
import { ANONYMOUS, isAdmin } from "../access/index.js";
import type { Caller } from "../access/index.js";
import type { Snapshot, SnapshotPending } from "../snapshot/index.js";
import { nameFor, shownTo, splitKey } from "../snapshot/index.js";
import type { Viewer } from "../snapshot/index.js";
import type { SnapshotMeta } from "../snapshot/index.js";
import { ForkdError } from "../util/index.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import type { Services } from "./services.js";

/** Whether `caller` may see something owned by `owner` (null/absent: shared). */
export function canSee(caller: Caller, owner: string | null | undefined): boolean {
  if (isAdmin(caller)) return true;
  if (caller === ANONYMOUS) return false;
  return owner === null || owner === undefined || owner === caller.tenant;
}

/** Whether `caller` may change something owned by `owner`. */
export const canChange = (caller: Caller, owner: string | null | undefined): boolean =>
  isAdmin(caller) || (caller !== ANONYMOUS && owner === caller.tenant);

/** Whether `caller` may hold (see, use, change) a sandbox of tenant `owner` (null/absent: an admin's). */
export const mayHold = (caller: Caller, owner: string | null | undefined): boolean =>
  isAdmin(caller) || (owner ?? null) === caller.tenant;

/** Sandboxes of `tenant` that hold resources (running or paused): what its quota counts. */
export const heldBy = (s: Services, tenant: string | null): number =>
  s.sandboxes.list().filter((sb) => (sb.record.owner ?? null) === tenant && sb.state !== "exited").length;

/** A sandbox that does not exist for the caller: one answer whether it is missing or another tenant's. */
export const noSandbox = (id: string): ForkdError => new ForkdError("not_found", `no sandbox ${id}`, { id });

/** Sandbox `id` if the caller may hold it (exited ones included), else not found. */
export function sandboxOf(s: Services, caller: Caller, id: string): ReadonlySandbox {
  const sb = s.sandboxes.get(id);
  if (!mayHold(caller, sb.record.owner)) throw noSandbox(id);
  return sb;
}

/** Sandbox `id` if the caller may hold it and it has not exited (running or paused), else not found. */
export function liveSandbox(s: Services, caller: Caller, id: string): ReadonlySandbox {
  const sb = sandboxOf(s, caller, id);
  if (sb.state === "exited") throw noSandbox(id);
  return sb;
}
export const noSnapshot = (tag: string): ForkdError =>
  new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });

/** Whose namespace the caller names snapshots in: its tenant's, or null for an admin. */
export const viewerOf = (caller: Caller): Viewer => (isAdmin(caller) ? null : (caller.tenant ?? ""));

/** How the caller is shown store keys (src/snapshot/namespace.ts nameFor). */
export type TagNames = (key: string) => string;
export const tagNames =
  (caller: Caller): TagNames =>
  (key) =>
    nameFor(viewerOf(caller), key);

/**
 * The store key the caller's `tag` reads: a snapshot it may see, ready, being written or failed
 * (else not found, as if it did not exist; a malformed tag is a 400).
 */
export async function snapshotKey(s: Services, caller: Caller, tag: string): Promise<string> {
  const key = await s.snapshots.namespaces.find(viewerOf(caller), tag);
  if (key === null) throw noSnapshot(tag);
  return key;
}

/**
 * The store key and owner of a snapshot the caller creates as `tag`: in its own namespace (an
 * admin: the key it names), refused for a reserved tag, a taken one or another tenant's namespace
 * (src/snapshot/namespace.ts forNew).
 */
export async function newSnapshotKey(
  s: Services,
  caller: Caller,
  tag: string,
): Promise<{ key: string; owner: string | null }> {
  const key = await s.snapshots.namespaces.forNew(viewerOf(caller), tag);
  return { key, owner: splitKey(key).ns };
}

/**
 * The key of a branch the caller tags `tag` of a sandbox of tenant `ns` (null: an admin's): a
 * branch is its sandbox's tenant's, so an admin's plain tag for a tenant's sandbox is in that
 * tenant's namespace. Undefined: the sandbox service picks one (br-<random>, in that namespace).
 */
export async function newBranchKey(
  s: Services,
  caller: Caller,
  ns: string | null,
  tag: string | undefined,
): Promise<string | undefined> {
  if (tag === undefined) return undefined;
  const named = isAdmin(caller) && ns !== null && splitKey(tag).ns === null ? `${ns}/${tag}` : tag;
  return (await newSnapshotKey(s, caller, named)).key;
}

/** A ready snapshot the caller may see (else not found, as if it did not exist), and its key. */
export async function visibleSnapshot(
  s: Services,
  caller: Caller,
  tag: string,
): Promise<Snapshot & { key: string }> {
  const key = await snapshotKey(s, caller, tag);
  if (!(await s.snapshots.has(key))) throw noSnapshot(tag);
  return { ...(await s.snapshots.get(key)), key };
}

/**
 * A snapshot the caller may change: its own (a tenant), any (an admin). A tenant naming a
 * reserved tag is refused the same whether or not a snapshot has it.
 */
export async function ownedSnapshot(
  s: Services,
  caller: Caller,
  tag: string,
): Promise<Snapshot & { key: string }> {
  if (!isAdmin(caller) && s.snapshots.namespaces.isReserved(splitKey(tag).name)) throw reserved(tag);
  const snap = await visibleSnapshot(s, caller, tag);
  if (!canChange(caller, snap.meta.owner))
    throw new ForkdError("forbidden", `snapshot ${tag} is shared; only an admin may change it`, { tag });
  return snap;
}

/** A tenant's change to a reserved tag (create, change, delete): one answer, existing or not. */
export const reserved = (tag: string): ForkdError =>
  new ForkdError(
    "forbidden",
    `tag ${tag} is reserved for the operator's shared snapshots; only an admin may create, change or delete it`,
    {
      tag,
    },
  );

/**
 * The key of a snapshot the caller may fork (else not found). One still being written (an async
 * branch) is judged by its pending record; the fork then waits for it as usual.
 */
export async function forkable(s: Services, caller: Caller, tag: string): Promise<string> {
  if (isAdmin(caller)) return (await s.snapshots.namespaces.find(null, tag)) ?? tag; // the fork reports a missing or corrupt one
  return snapshotKey(s, caller, tag);
}

/** Of all snapshots, those the caller is shown (namespace.ts shownTo). */
export const visibleMetas = (caller: Caller, list: SnapshotMeta[]): SnapshotMeta[] =>
  shownTo(
    viewerOf(caller),
    list,
    (m) => m.tag,
    (m) => m.owner,
  );

export const visiblePending = (caller: Caller, list: SnapshotPending[]): SnapshotPending[] =>
  shownTo(
    viewerOf(caller),
    list,
    (p) => p.tag,
    (p) => p.owner,
  );
