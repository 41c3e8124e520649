/** Snapshot calls of the tree page: a node's chain and sizes, and deletion (a dry run first, then the real one). */
import { api } from "./http";
import type { Deleted, SnapshotInfo } from "./types";

const base = (tag: string) => `/v1/snapshots/${encodeURIComponent(tag)}`;

export const info = (tag: string) => api<SnapshotInfo>("GET", `${base(tag)}/info`);

/** What a delete removes or would remove (the dry run answers the same shape without removing anything). */
export type DeletePlan = Deleted & Record<string, unknown>;

export const removeSnapshot = (tag: string, opts: { cascade: boolean; dryRun: boolean }) =>
  api<DeletePlan>("DELETE", base(tag), undefined, {
    cascade: opts.cascade ? "true" : undefined,
    dry_run: opts.dryRun ? "true" : undefined,
  });
