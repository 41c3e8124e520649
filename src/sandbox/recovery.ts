/**
 * What recovery (SandboxService.recover) does to records a dead daemon left mid-operation:
 *   - a pause written ahead (`paused.pending`: device state and private pages saved, memory
 *     image not built yet) is finished here when its VMM is gone: memory = base + diff;
 *   - a fan-out whose reply was never sent leaves children nobody knows the ids of: they are
 *     adopted unclaimed, with a short idle timeout (docs/operations.md);
 *   - paused-image directories no record names (a pause that had not written its record) go.
 * See docs/operations.md "Crash recovery" for the whole table.
 */
import { readdir, rename, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { exists } from "../util/index.js";
import { ForkdError } from "../util/index.js";
import type { MemoryDiffs } from "../vmm/index.js";
import type { PausedImage, SandboxRecord } from "./sandbox.js";

/** The idle timeout an unclaimed sandbox (a fan-out's reply never sent) is adopted with. */
export const UNCLAIMED_IDLE_MS = 5 * 60_000;

/** The journal file a fan-out holds while its reply has not been sent. */
export const fanoutJournal = (root: string, id: string): string => join(root, `.fanout-${id}`);
export const FANOUT_PREFIX = ".fanout-";

/**
 * Builds a paused image's memory file: `out` = `base` with `diff`'s pages over it, written to a
 * partial file and renamed, so `out` exists only whole; the diff goes after.
 */
export async function buildMemory(
  memsnap: MemoryDiffs,
  base: string,
  diff: string,
  out: string,
): Promise<void> {
  const partial = `${out}.partial`;
  await rm(partial, { force: true });
  await memsnap.apply(base, diff, partial);
  await rename(partial, out);
  await rm(diff, { force: true });
}

/**
 * Finishes a pause written ahead whose VMM is gone: builds its memory image unless the dead
 * daemon got that far, and returns the record of a paused sandbox (no slot: nothing runs).
 */
export async function finishPause(memsnap: MemoryDiffs | null, r: SandboxRecord): Promise<SandboxRecord> {
  const p = r.paused;
  if (!p?.pending) throw new ForkdError("internal", "no pause to finish");
  if (!(await exists(p.memory))) {
    if (!memsnap) throw new ForkdError("unavailable", "finishing a pause needs forkd-memsnap");
    if (!(await exists(p.pending.diff)) || !(await exists(p.vmstate)))
      throw new ForkdError("snapshot_corrupt", "the pause's saved state is incomplete");
    await buildMemory(memsnap, p.pending.base, p.pending.diff, p.memory);
  } else await rm(p.pending.diff, { force: true });
  return pausedRecord(r, p);
}

/** The final record of a paused sandbox: the image complete, its slot given back. */
export function pausedRecord(r: SandboxRecord, p: PausedImage): SandboxRecord {
  const { pending: _p, ...image } = p;
  const { memoryFile: _m, ...rest } = r;
  return {
    ...rest,
    paused: image,
    network: r.network ? { ...r.network, slot: null } : undefined,
    // Paused, it has no deadline (E2B's semantics), in the same write: a resume sets a new one.
    ...(r.deadline !== undefined ? { deadline: null } : {}),
  };
}

/** The record of a sandbox whose pause is undone (its VMM still runs): as before the pause. */
export function unpausedRecord(r: SandboxRecord): SandboxRecord {
  const { paused: _p, ...rest } = r;
  return rest;
}

/** An unclaimed sandbox's record: its idle timeout at most UNCLAIMED_IDLE_MS, and it is killed then. */
export function unclaimedRecord(r: SandboxRecord): SandboxRecord {
  const { fanout: _f, ...rest } = r;
  const timeoutMs = Math.min(r.timeoutMs ?? UNCLAIMED_IDLE_MS, UNCLAIMED_IDLE_MS);
  return { ...rest, timeoutMs, onIdle: "kill" };
}

/** Directories of paused images in `dir` that `r` does not use (a pause cut short). */
export async function strayImages(dir: string, r: SandboxRecord): Promise<string[]> {
  const keep = new Set(
    [r.memoryFile, r.paused?.memory].filter((f): f is string => typeof f === "string").map((f) => dirname(f)),
  );
  return (await readdir(dir))
    .filter((n) => n.startsWith("paused-"))
    .map((n) => join(dir, n))
    .filter((d) => !keep.has(d));
}
