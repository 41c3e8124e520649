/**
 * Placement (src/cluster/placement.ts): warm first, then held, then room; never a draining node
 * or one of another machine; a large fork spreads; a full cluster leaves children unplaced.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { HELD_BONUS, WARM_BONUS, mostRoom, place } from "../../src/cluster/placement.js";
import type { Candidate } from "../../src/cluster/placement.js";

const M = { accel: "kvm" as const, qemu: "8.2.2", cpu: "EPYC" };
const node = (id: string, o: Partial<Candidate> = {}): Candidate => ({
  id,
  machine: M,
  draining: false,
  maxSandboxes: 20,
  held: 0,
  assigned: 0,
  warm: 0,
  holds: false,
  ...o,
});
const counts = (r: ReturnType<typeof place>) =>
  Object.fromEntries(r.placements.map((p) => [p.node, p.count]));

test("one child goes where the snapshot is warm, then where it is held, then where there is room", () => {
  assert.deepEqual(
    counts(place([node("a"), node("b", { holds: true }), node("c", { warm: 1, holds: true })], 1, M)),
    {
      c: 1,
    },
  );
  assert.deepEqual(counts(place([node("a"), node("b", { holds: true }), node("c")], 1, M)), { b: 1 });
  assert.deepEqual(
    counts(place([node("a", { held: 5 }), node("b", { held: 2 }), node("c", { held: 9 })], 1, M)),
    {
      b: 1,
    },
  );
  // The bonus is small: a warm node far busier than another loses to it.
  assert.deepEqual(counts(place([node("a", { warm: 2, holds: true, held: 10 }), node("b")], 1, M)), { b: 1 });
  assert.ok(WARM_BONUS > HELD_BONUS && WARM_BONUS <= 4, "the bonus is worth a few children");
});

test("fork -n 30 of a snapshot held on one node of three spreads over the three", () => {
  const r = place([node("n1", { holds: true, warm: 2 }), node("n2"), node("n3")], 30, M);
  const c = counts(r);
  assert.equal(r.unplaced, 0);
  assert.deepEqual(Object.keys(c).sort(), ["n1", "n2", "n3"]);
  assert.equal((c.n1 ?? 0) + (c.n2 ?? 0) + (c.n3 ?? 0), 30);
  // The holder takes a few more (its bonus), none takes most.
  assert.ok((c.n1 ?? 0) >= (c.n2 ?? 0) && (c.n1 ?? 0) <= 14, JSON.stringify(c));
  assert.ok((c.n2 ?? 0) >= 8 && (c.n3 ?? 0) >= 8, JSON.stringify(c));
  // The holder is chosen first: its part comes first.
  assert.equal(r.placements[0]?.node, "n1");
  // At the default bound (FORKD_MAX_SANDBOXES=1000) too: the bonus is children, not a fraction of it.
  const big = (id: string, o: Partial<Candidate> = {}) => ({ ...node(id, o), maxSandboxes: 1000 });
  const d = counts(place([big("n1", { holds: true, warm: 2 }), big("n2"), big("n3")], 30, M));
  assert.deepEqual(Object.keys(d).sort(), ["n1", "n2", "n3"], JSON.stringify(d));
  assert.ok((d.n2 ?? 0) >= 8 && (d.n3 ?? 0) >= 8, JSON.stringify(d));
});

test("a node's load counts its held, its assigned and this fork's children", () => {
  const c = counts(place([node("a", { held: 10 }), node("b", { assigned: 10 }), node("c")], 10, M));
  assert.deepEqual(c, { c: 10 });
  const d = counts(place([node("a", { held: 10 }), node("b", { assigned: 10 }), node("c")], 16, M));
  assert.deepEqual(d, { a: 2, b: 2, c: 12 });
});

test("draining nodes and nodes of another machine are never chosen", () => {
  const r = place(
    [
      node("a", { draining: true, warm: 5, holds: true }),
      node("b", { machine: { ...M, qemu: "9.0.0" }, holds: true }),
      node("c", { machine: { ...M, accel: "tcg" } }),
      node("d", { machine: { ...M, cpu: "other" } }),
      node("e"),
    ],
    5,
    M,
  );
  assert.deepEqual(counts(r), { e: 5 });
  // No machine to match (unknown): any node that takes work.
  assert.deepEqual(
    Object.keys(
      counts(place([node("a", { draining: true }), node("c", { machine: { ...M, accel: "tcg" } })], 1, null)),
    ),
    ["c"],
  );
});

test("children past every node's room are left unplaced", () => {
  const r = place([node("a", { maxSandboxes: 3, held: 1 }), node("b", { maxSandboxes: 2 })], 10, M);
  assert.equal(r.unplaced, 6);
  assert.deepEqual(counts(r), { a: 2, b: 2 });
  const none = place([node("a", { maxSandboxes: 0 })], 2, M);
  assert.deepEqual(none, { placements: [], unplaced: 2 });
});

test("placement is deterministic: ties go to the first id", () => {
  const r1 = place([node("c"), node("a"), node("b")], 3, M);
  const r2 = place([node("b"), node("c"), node("a")], 3, M);
  assert.deepEqual(r1, r2);
  assert.deepEqual(
    r1.placements.map((p) => p.node),
    ["a", "b", "c"],
  );
});

test("the node with the most room makes snapshots; a draining one never", () => {
  assert.equal(
    mostRoom([node("a", { held: 5 }), node("b", { held: 1 }), node("c", { draining: true })]),
    "b",
  );
  assert.equal(
    mostRoom([node("a", { held: 5, maxSandboxes: 10 }), node("b", { held: 8, maxSandboxes: 100 })]),
    "b",
  );
  assert.equal(mostRoom([node("a", { draining: true })]), null);
});
