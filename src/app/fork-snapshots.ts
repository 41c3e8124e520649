/**
 * The snapshots behind branch-then-fork (./branch-fork.ts; tag `e2b-fork-…`, in the source's
 * tenant's namespace): a fork's children run from the branch of
 * their source, so it stays while one does; once none does (and it is older than a grace period,
 * so a fork between its branch and its children is never raced) it is deleted. Called after
 * kills (./lifecycle.ts) and branch-then-forks, never from a timer of its own; a snapshot something else still needs (a
 * branch of a child stacked on it) is refused by the delete and left.
 */
import type { Services } from "./services.js";
import { errorMessage } from "../util/index.js";
import { splitKey } from "../snapshot/index.js";

/** Tags of the snapshots forks are made from (kept out of the snapshot list). */
export const FORK_TAG_PREFIX = "e2b-fork-";

const GRACE_MS = 10 * 60_000;

/** Reaps in the background (a failure is logged): what a kill or a fork leaves to do. */
export function reapLater(s: Services): void {
  reapForkSnapshots(s).catch((e: unknown) =>
    s.log.warn("reaping fork snapshots failed", { error: errorMessage(e) }),
  );
}

export async function reapForkSnapshots(s: Services, now = Date.now()): Promise<string[]> {
  const gone: string[] = [];
  for (const m of await s.store.list()) {
    if (!splitKey(m.tag).name.startsWith(FORK_TAG_PREFIX) || now - Date.parse(m.created) < GRACE_MS) continue;
    if (s.sandboxes.countByTag(m.tag) > 0) continue;
    try {
      await s.snapshots.delete(m.tag, { cascade: false, force: false });
      gone.push(m.tag);
    } catch (e) {
      s.log.info("fork snapshot kept", { tag: m.tag, reason: errorMessage(e) });
    }
  }
  return gone;
}
