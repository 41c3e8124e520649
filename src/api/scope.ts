/**
 * Tenant scoping. An admin caller (the unix socket, FORKD_TOKEN, an admin-scoped token) sees
 * everything. A tenant's caller sees:
 *   - sandboxes: its own only. Another tenant's sandbox is "not found", exactly as a sandbox that
 *     does not exist, so ids do not leak;
 *   - snapshots: its own, and shared ones (owner null: made by an admin), which it may fork,
 *     read and pack but not change. Another tenant's snapshot is "not found" too. Tags are one
 *     namespace: creating a tag another tenant holds is a conflict (the name is visible, never
 *     the snapshot).
 * The middleware guards every /v1/sandboxes/{id} route with Hono's own reading of {id}, the
 * one the routes act on.
 */
import type { MiddlewareHandler } from "hono";
import { ANONYMOUS, isAdmin } from "../access/caller.js";
import type { Caller } from "../access/caller.js";
import type { Snapshot, SnapshotPending } from "../snapshot/store.js";
import { ForkdError } from "../util/errors.js";
import type { ApiEnv } from "./env.js";
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

export const noSandbox = (id: string): ForkdError => new ForkdError("not_found", `no sandbox ${id}`, { id });
export const noSnapshot = (tag: string): ForkdError =>
  new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });

/**
 * Refuses a sandbox that is not the tenant's own (another tenant's, or an admin's) as not found;
 * a missing or malformed id is left to the route.
 */
export function sandboxGuard(s: Services): MiddlewareHandler<ApiEnv> {
  return async (c, next) => {
    const caller = c.get("caller");
    const id = c.req.param("id");
    if (!isAdmin(caller) && id !== undefined) {
      let owner: string | null | undefined;
      try {
        owner = s.sandboxes.get(id).record.owner;
      } catch {
        return next();
      }
      if (owner !== caller.tenant) throw noSandbox(id);
    }
    return next();
  };
}

/** A ready snapshot the caller may see (else not found, as if it did not exist). */
export async function visibleSnapshot(s: Services, caller: Caller, tag: string): Promise<Snapshot> {
  const snap = await s.snapshots.get(tag);
  if (!canSee(caller, snap.meta.owner)) throw noSnapshot(tag);
  return snap;
}

/** A snapshot the caller may change: its own (a tenant), any (an admin). */
export async function ownedSnapshot(s: Services, caller: Caller, tag: string): Promise<Snapshot> {
  const snap = await visibleSnapshot(s, caller, tag);
  if (!canChange(caller, snap.meta.owner))
    throw new ForkdError("forbidden", `snapshot ${tag} is shared; only an admin may change it`, { tag });
  return snap;
}

/**
 * Refuses a fork of a snapshot the caller may not see. One still being written (an async
 * branch) is judged by its pending record; the fork then waits for it as usual.
 */
export async function forkable(s: Services, caller: Caller, tag: string): Promise<void> {
  if (isAdmin(caller)) return; // the fork itself reports a missing or corrupt snapshot
  if (await s.snapshots.has(tag)) {
    await visibleSnapshot(s, caller, tag);
    return;
  }
  const p = await s.snapshots.pending(tag);
  if (!p || !canSee(caller, p.owner)) throw noSnapshot(tag);
}

export const visiblePending = (caller: Caller, list: SnapshotPending[]): SnapshotPending[] =>
  list.filter((p) => canSee(caller, p.owner));
