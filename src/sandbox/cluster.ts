/**
 * What a cluster asks of the sandbox service (src/cluster/ implements it; a daemon alone has
 * none and behaves as before): new work only while the node is a member, a snapshot the node
 * lacks fetched from a peer before a fork looks it up, and every child's location recorded in
 * the cluster before its fork answers.
 */
import type { ReadonlySandbox } from "./sandbox.js";

export interface SandboxCluster {
  /** Throws `unavailable` while this node may take no new work (cut off from the cluster). */
  admit(what: string): void;
  /**
   * Makes snapshot `tag` a local one when the cluster's catalog has it and this node does not
   * (fetched from a holder, once however many forks wait); nothing when it is here or unknown.
   */
  ensureSnapshot(tag: string): Promise<void>;
  /**
   * Records where `children` run, before their fork answers (fenced on the node's lease). A
   * throw: the fork kills them and fails with that error.
   */
  recordForked(children: ReadonlySandbox[]): Promise<void>;
}
