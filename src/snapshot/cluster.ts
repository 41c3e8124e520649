/**
 * What a cluster asks of the snapshot store and service (src/cluster/ implements it; a daemon
 * alone has none and behaves as before): tags are cluster-wide, so a new tag is claimed in the
 * cluster's catalog before any work and published there just before it is published here; a
 * delete through the API is refused while the snapshot is used anywhere and removes it from the
 * catalog; tags the catalog has and this node does not are names the namespaces know.
 */
import type { SnapshotMeta } from "./meta.js";
import type { KeyEntry } from "./namespace.js";

export interface SnapshotCluster {
  /**
   * Before any work on a new tag: refuses a key the cluster has (conflict), or any new work
   * while this node is cut off from the cluster (unavailable). A copy this node is fetching from
   * a peer passes.
   */
  claim(tag: string): Promise<void>;
  /**
   * `tag` is sealed (`meta` written) and about to be published here: its catalog entry is
   * written now (create-only; another node's entry with another digest is a conflict, and the
   * caller removes what it made).
   */
  publishing(tag: string, meta: SnapshotMeta): Promise<void>;
  /**
   * After the publication (`ok`: settles once the cluster shows this node holding it, or after a
   * bounded wait; never rejects), or when it failed after publishing() (its entry is withdrawn).
   */
  published(tag: string, ok: boolean): Promise<void>;
  /** `tag` was deleted from this node (its own entry leaves the catalog; a copy's does not). */
  deleted(tag: string): void;
  /**
   * `tag` (its chain `chain`, root first) was pushed to a registry: recorded in the cluster so
   * that a node no live peer serves can fetch it from there. Never rejects (the push stands).
   */
  pushed(tag: string, chain: string[], p: { ref: string; digest: string; insecure: boolean }): Promise<void>;
  /** What the catalog has at `key` (a snapshot of another node), or undefined. */
  lookup(key: string): KeyEntry | undefined;
  /**
   * Before a delete through the API changes anything (local checks passed): refuses while any
   * sandbox in the cluster runs from what would go (conflict, naming them), else removes it from
   * the catalog (every node then removes its copy). `local`: the keys this node's delete would
   * remove. Returns the keys removed from the catalog (not_found when `tag` is in neither).
   */
  deleting(tag: string, o: { cascade: boolean; force: boolean }, local: string[]): Promise<string[]>;
}
