/** Snapshot calls of the tree page: a node's chain and sizes, and deletion (a dry run first, then the real one). */
import { api } from "./http";
import type { Deleted, DeletePlan, SnapshotInfo } from "./types";

const base = (tag: string) => `/v1/snapshots/${encodeURIComponent(tag)}`;

export const info = (tag: string) => api<SnapshotInfo>("GET", `${base(tag)}/info`);

const query = (cascade: boolean, dryRun: boolean) => ({
  cascade: cascade ? "1" : undefined,
  dry_run: dryRun ? "1" : undefined,
});

export const planDelete = (tag: string, cascade: boolean) =>
  api<DeletePlan>("DELETE", base(tag), undefined, query(cascade, true));
export const removeSnapshot = (tag: string, cascade: boolean) =>
  api<Deleted>("DELETE", base(tag), undefined, query(cascade, false));
