/**
 * The web console's own small libraries (console/src/lib): the Prometheus text parser, the
 * series history (counters as rates), the snapshot tree's layout and memory-base edges, the hash
 * routes, the live state folded from the event stream, a cluster's nodes (the answer to GET
 * /v1/nodes, states, free slots, totals) and the sandboxes' filter by node.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseExposition, seriesKey } from "../../console/src/lib/prometheus.js";
import { addSample, EMPTY_HISTORY } from "../../console/src/lib/series-history.js";
import { layoutTree } from "../../console/src/lib/tree-layout.js";
import { hrefOf, parseRoute } from "../../console/src/lib/route.js";
import { applyEvent, EMPTY } from "../../console/src/lib/live-state.js";
import { memoryBaseOf } from "../../console/src/lib/snapshot-parent.js";
import {
  anyNode,
  clusterTotals,
  freeSlots,
  nodeState,
  refusalAnswer,
} from "../../console/src/lib/cluster-nodes.js";
import { matches, NO_FILTER } from "../../console/src/lib/sandbox-filter.js";
import type { ClusterNode, Sandbox, SnapshotView } from "../../console/src/api/types.js";

const TEXT = `# HELP forkd_forks_total Forks.
# TYPE forkd_forks_total counter
forkd_forks_total{snapshot="a b",result="ok"} 10
forkd_forks_total{result="fail",snapshot="q\\"x\\\\y"} 2
# TYPE forkd_sandboxes gauge
forkd_sandboxes 3
# TYPE forkd_fork_seconds histogram
forkd_fork_seconds_bucket{le="0.1"} 4
forkd_fork_seconds_bucket{le="+Inf"} 5
forkd_fork_seconds_sum 0.75
forkd_fork_seconds_count 5
broken{x="1" 7
nan_gauge NaN
inf_gauge +Inf
`;

test("the Prometheus parser reads names, labels (escapes included), values and types", () => {
  const { samples, types } = parseExposition(TEXT);
  assert.equal(types.forkd_forks_total, "counter");
  assert.equal(types.forkd_fork_seconds, "histogram");
  const forks = samples.filter((s) => s.name === "forkd_forks_total");
  assert.deepEqual(forks[0]?.labels, { snapshot: "a b", result: "ok" });
  assert.deepEqual(forks[1]?.labels, { result: "fail", snapshot: 'q"x\\y' });
  assert.equal(
    samples.find((s) => s.name === "forkd_fork_seconds_bucket" && s.labels.le === "+Inf")?.value,
    5,
  );
  assert.equal(samples.find((s) => s.name === "inf_gauge")?.value, Infinity);
  assert.equal(
    samples.find((s) => s.name === "broken"),
    undefined,
    "a malformed line is skipped",
  );
  const first = forks[0];
  assert.ok(first);
  assert.equal(seriesKey(first), 'forkd_forks_total{result="ok",snapshot="a b"}');
});

test("the series history keeps gauges as values, counters as per-second rates, no buckets", () => {
  const t0 = 1_000_000;
  let h = addSample(EMPTY_HISTORY, TEXT, t0, 3);
  assert.deepEqual(h.series.forkd_sandboxes, [{ t: t0, v: 3 }]);
  assert.equal(
    h.series['forkd_forks_total{result="ok",snapshot="a b"}'],
    undefined,
    "a rate needs two samples",
  );
  assert.ok(!Object.keys(h.series).some((k) => k.includes("_bucket")));
  const later = TEXT.replace('result="ok"} 10', 'result="ok"} 20').replace(
    "forkd_sandboxes 3",
    "forkd_sandboxes 4",
  );
  h = addSample(h, later, t0 + 5000, 3);
  assert.deepEqual(h.series['forkd_forks_total{result="ok",snapshot="a b"}'], [{ t: t0 + 5000, v: 2 }]);
  assert.equal(h.rate['forkd_forks_total{result="ok",snapshot="a b"}'], true);
  for (let i = 2; i < 6; i++) h = addSample(h, later, t0 + i * 5000, 3);
  assert.equal(h.series.forkd_sandboxes?.length, 3, "bounded to `keep` points");
  assert.equal(h.series.nan_gauge, undefined);
  assert.equal(h.series.inf_gauge, undefined);
});

test("the tree layout puts children a level below their parent, parents over their children", () => {
  const l = layoutTree(
    [
      { id: "base", parent: null },
      { id: "b1", parent: "base" },
      { id: "b2", parent: "base" },
      { id: "b1a", parent: "b1" },
      { id: "lost", parent: "gone" },
    ],
    100,
    50,
  );
  const at = Object.fromEntries(l.nodes.map((n) => [n.id, n]));
  assert.equal(l.nodes.length, 5);
  assert.deepEqual(l.edges.map((e) => `${e.from}>${e.to}`).sort(), ["b1>b1a", "base>b1", "base>b2"]);
  assert.equal(at.b1!.depth, 1);
  assert.equal(at.b1a!.depth, 2);
  assert.equal(at.lost!.depth, 0, "a snapshot whose parent is not listed is a root");
  assert.equal(at.base!.x, (at.b1!.x + at.b2!.x) / 2);
  assert.ok(at.b1a!.y > at.b1!.y && at.b1!.y > at.base!.y);
  const xs = l.nodes.filter((n) => n.depth === 0).map((n) => n.x);
  assert.equal(new Set(xs).size, xs.length, "roots do not overlap");
});

test("a parent cycle (a corrupt chain) still places every node once", () => {
  const l = layoutTree(
    [
      { id: "a", parent: "b" },
      { id: "b", parent: "a" },
    ],
    10,
    10,
  );
  assert.deepEqual(l.nodes.map((n) => n.id).sort(), ["a", "b"]);
});

test("hash routes parse and print back", () => {
  assert.deepEqual(parseRoute(""), { page: "sandboxes" });
  assert.deepEqual(parseRoute("#/snapshots/br-1"), { page: "snapshots", tag: "br-1" });
  assert.deepEqual(parseRoute("#/sandboxes/sb-abc"), { page: "sandbox", id: "sb-abc" });
  assert.deepEqual(parseRoute("#/nonsense"), { page: "sandboxes" });
  assert.deepEqual(parseRoute("#/nodes"), { page: "nodes" });
  for (const h of ["#/sandboxes", "#/snapshots", "#/snapshots/x.y", "#/sandboxes/sb-1", "#/nodes", "#/host"])
    assert.equal(hrefOf(parseRoute(h)), h);
});

test("the live state: `state` replaces, deltas add and remove, a drop marks it disconnected", () => {
  const sb = (id: string, state: Sandbox["state"]) => ({ id, tag: "t", state }) as Sandbox;
  let s = applyEvent(EMPTY, { type: "state", data: { sandboxes: [sb("a", "running")], snapshots: [] } });
  assert.equal(s.connected, true);
  s = applyEvent(s, { type: "sandbox", data: sb("b", "running") });
  s = applyEvent(s, { type: "sandbox", data: sb("a", "paused") });
  s = applyEvent(s, { type: "usage", data: { sandboxes: { b: { cpu_percent: 5, memory_bytes: 1 } } } });
  assert.equal(s.sandboxes.a?.state, "paused");
  s = applyEvent(s, { type: "sandbox-gone", data: { id: "b", exit_reason: "killed" } });
  assert.deepEqual(Object.keys(s.sandboxes), ["a"]);
  assert.equal(s.usage.b, undefined);
  s = applyEvent(s, { type: "lost" });
  assert.equal(s.connected, false);
  s = applyEvent(s, { type: "state", data: { sandboxes: [], snapshots: [] } });
  assert.deepEqual(s.sandboxes, {});
  assert.equal(s.connected, true);
});

test("the live state: `state` holds the snapshots being written or failed too; a tag in both reads ready", () => {
  const ready = { tag: "a", status: "ready" } as SnapshotView;
  const writing = { tag: "b", status: "writing", source: null } as SnapshotView;
  const stale = { tag: "a", status: "writing", source: null } as SnapshotView;
  const s = applyEvent(EMPTY, {
    type: "state",
    data: { sandboxes: [], snapshots: [ready], pending: [writing, stale] },
  });
  assert.deepEqual(
    Object.values(s.snapshots)
      .map((x) => `${x.tag}:${x.status}`)
      .sort(),
    ["a:ready", "b:writing"],
  );
});

test("a diff snapshot's memory base is drawn only when it is not its parent", () => {
  const snap = (tag: string, parent: string | null, base: string | null) =>
    ({
      tag,
      status: "ready",
      parent: parent ? { tag: parent, checksum: "x" } : null,
      ...(base ? { memory_base: { tag: base, checksum: "y" } } : {}),
    }) as SnapshotView;
  assert.equal(memoryBaseOf(snap("root", null, null)), null);
  assert.equal(memoryBaseOf(snap("br", "root", "root")), null, "its parent: the parent edge says it");
  assert.equal(memoryBaseOf(snap("br2", "br", "root")), "root");
  assert.equal(memoryBaseOf({ tag: "w", status: "writing", source: null } as SnapshotView), null);
});

test("a cluster's nodes: 404 is one daemon, 403 a tenant, other failures stay failures; states, slots, totals", () => {
  assert.deepEqual(refusalAnswer(404, "one daemon"), { kind: "alone", message: "one daemon" });
  assert.deepEqual(refusalAnswer(403, "admins only"), { kind: "forbidden", message: "admins only" });
  for (const status of [401, 500, 502, 503]) assert.equal(refusalAnswer(status, "x"), null);
  const node = (id: string, o: { draining?: boolean; max?: number; running?: number; paused?: number }) =>
    ({
      id,
      draining: o.draining ?? false,
      capacity: {
        cores: 4,
        memory_mib: 8192,
        free_memory_mib: 4096,
        max_sandboxes: o.max ?? 10,
        running: o.running ?? 0,
        paused: o.paused ?? 0,
      },
    }) as ClusterNode;
  const a = node("a", { running: 3, paused: 2 });
  const b = node("b", { draining: true, running: 1 });
  const full = node("c", { max: 2, running: 3 });
  assert.deepEqual([nodeState(a), nodeState(b)], ["serving", "draining"]);
  assert.deepEqual([freeSlots(a), freeSlots(b), freeSlots(full)], [5, 9, 0]);
  // A draining node's slots are not free: it takes no new work.
  assert.deepEqual(clusterTotals([a, b, full]), {
    nodes: 3,
    draining: 1,
    running: 7,
    paused: 2,
    free: 5,
    cores: 12,
  });
  assert.deepEqual(clusterTotals([]), { nodes: 0, draining: 0, running: 0, paused: 0, free: 0, cores: 0 });
});

test("sandboxes name their node only in a cluster; the list filters by node and finds it by text", () => {
  const sb = (id: string, node: string | null) =>
    ({ id, tag: "t", state: "running", node, metadata: {}, network: { mode: "none" } }) as Sandbox;
  const alone = [sb("a", null), sb("b", null)];
  const spread = [sb("c", "n1"), sb("d", "n2"), sb("e", null)];
  assert.equal(anyNode(alone), false);
  assert.equal(anyNode([]), false);
  assert.equal(anyNode(spread), true);
  assert.deepEqual(
    spread.filter((s) => matches(s, { ...NO_FILTER, node: "n2" })).map((s) => s.id),
    ["d"],
  );
  assert.deepEqual(
    spread.filter((s) => matches(s, { ...NO_FILTER, text: "N1" })).map((s) => s.id),
    ["c"],
  );
  assert.equal(spread.filter((s) => matches(s, NO_FILTER)).length, 3);
});
