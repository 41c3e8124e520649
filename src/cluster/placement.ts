/**
 * Where a fork's children go (pure policy: the gateway gives it what etcd and its own in-flight
 * forks say; docs/cluster.md, "Placement"). A node is a candidate when it takes work (not
 * draining), runs the snapshot's machine (accelerator, QEMU version and CPU model equal to its
 * catalog entry's: device state loads only there) and has room. Each child goes, one at a time,
 * to the candidate with the lowest score: its load (held + assigned + placed here) less a
 * locality bonus counted in children, while it has a warm pool member of the snapshot left
 * (WARM_BONUS) or holds it (HELD_BONUS), as a fraction of its maxSandboxes. So a fork goes first
 * where the snapshot is warm, then where it is held, then where there is room, and a large one
 * spreads: the bonus is worth a few children whatever FORKD_MAX_SANDBOXES is (an upper bound, not
 * what a node runs well: fork -n 30 of a snapshot on one node of three spreads over the three;
 * a bonus of a fraction of the bound kept all 30 on the holder at the default bound of 1000).
 * Ties go to the node id first in order, so the result is deterministic.
 */
import type { MachineKind } from "./records.js";

/** One node as placement sees it. */
export interface Candidate {
  id: string;
  machine: MachineKind;
  draining: boolean;
  /** FORKD_MAX_SANDBOXES of the node. */
  maxSandboxes: number;
  /** Sandboxes it holds now (running and paused, from its record). */
  held: number;
  /** Children sent to it that its record does not count yet (this gateway's forks in flight). */
  assigned: number;
  /** Its warm pool members of the snapshot (holdings/). */
  warm: number;
  /** Whether it holds the snapshot whole (holdings/). */
  holds: boolean;
}

/** Children of one fork on one node. */
export interface Placement {
  node: string;
  count: number;
}

export interface PlacementResult {
  /** In the order the nodes were first chosen. */
  placements: Placement[];
  /** Children no candidate had room for. */
  unplaced: number;
}

/** Children a node with a warm member of the snapshot, or holding it, takes before others. */
export const WARM_BONUS = 4;
export const HELD_BONUS = 2;

export const sameMachine = (a: MachineKind, b: MachineKind): boolean =>
  a.accel === b.accel && a.qemu === b.qemu && a.cpu === b.cpu;

/** Whether `c` may take new children of a snapshot made on `machine` (null: any machine). */
export function eligible(c: Candidate, machine: MachineKind | null): boolean {
  return !c.draining && c.maxSandboxes > 0 && (machine === null || sameMachine(c.machine, machine));
}

/** Places `n` children of a snapshot made on `machine` (null: unknown, any node). */
export function place(
  candidates: readonly Candidate[],
  n: number,
  machine: MachineKind | null,
): PlacementResult {
  const pool = candidates
    .filter((c) => eligible(c, machine))
    .slice()
    .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const here = new Map<string, number>();
  const order: string[] = [];
  let unplaced = 0;
  for (let i = 0; i < n; i++) {
    let best: Candidate | null = null;
    let bestScore = Infinity;
    for (const c of pool) {
      const mine = here.get(c.id) ?? 0;
      const used = c.held + c.assigned + mine;
      if (used >= c.maxSandboxes) continue;
      const bonus = c.warm > mine ? WARM_BONUS : c.holds ? HELD_BONUS : 0;
      const score = (used - bonus) / c.maxSandboxes;
      if (score < bestScore) {
        best = c;
        bestScore = score;
      }
    }
    if (best === null) {
      unplaced++;
      continue;
    }
    if (!here.has(best.id)) order.push(best.id);
    here.set(best.id, (here.get(best.id) ?? 0) + 1);
  }
  return { placements: order.map((node) => ({ node, count: here.get(node) ?? 0 })), unplaced };
}

/**
 * The node with the most room (the lowest load fraction, then the most free slots), for work
 * that is not a fork (a snapshot's creation or build, an unpack, a pull); null: none takes work.
 */
export function mostRoom(candidates: readonly Candidate[]): string | null {
  let best: Candidate | null = null;
  const load = (c: Candidate) => (c.held + c.assigned) / c.maxSandboxes;
  const free = (c: Candidate) => c.maxSandboxes - c.held - c.assigned;
  for (const c of candidates) {
    if (!eligible(c, null)) continue;
    if (
      best === null ||
      load(c) < load(best) ||
      (load(c) === load(best) && (free(c) > free(best) || (free(c) === free(best) && c.id < best.id)))
    )
      best = c;
  }
  return best?.id ?? null;
}
