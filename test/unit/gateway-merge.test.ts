/**
 * How the gateway merges nodes' answers (src/gateway/merge.ts): pages of a listing give the page
 * one listing of every node would; fork parts give one ForkResult with the caller's indexes.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mergeFork, mergePages } from "../../src/gateway/merge.js";

const key = (x: { k: string }) => x.k;
const items = (...ks: string[]) => ks.map((k) => ({ k }));

test("pages merge in order, cut at the limit; more when cut or when a node had more", () => {
  const m = mergePages(
    [
      { items: items("a", "d"), more: false },
      { items: items("b", "c", "e"), more: false },
    ],
    key,
    3,
  );
  assert.deepEqual(m.items.map(key), ["a", "b", "c"]);
  assert.equal(m.more, true);
  const all = mergePages(
    [
      { items: items("b"), more: false },
      { items: items("a"), more: false },
    ],
    key,
    undefined,
  );
  assert.deepEqual(all, { items: items("a", "b"), more: false });
  const nodeMore = mergePages(
    [
      { items: items("a"), more: true },
      { items: [], more: false },
    ],
    key,
    5,
  );
  assert.deepEqual(nodeMore, { items: items("a"), more: true });
  const desc = mergePages(
    [
      { items: items("a", "c"), more: false },
      { items: items("b"), more: false },
    ],
    key,
    2,
    "desc",
  );
  assert.deepEqual(desc.items.map(key), ["c", "b"]);
  // One item twice (a snapshot held by two nodes) is listed once.
  assert.deepEqual(
    mergePages(
      [
        { items: items("x"), more: false },
        { items: items("x"), more: false },
      ],
      key,
      10,
    ).items,
    items("x"),
  );
});

test("paging through merged pages visits every item once", () => {
  // Three nodes' sorted items; pages of 4 asked with the same cursor of each.
  const nodes = [items("a", "e", "i", "m"), items("b", "c", "j"), items("d", "f", "g", "h", "k", "l")];
  const seen: string[] = [];
  let after = "";
  for (let round = 0; round < 10; round++) {
    const pages = nodes.map((ns) => {
      const rest = ns.filter((x) => x.k > after);
      return { items: rest.slice(0, 4), more: rest.length > 4 };
    });
    const m = mergePages(pages, key, 4);
    seen.push(...m.items.map(key));
    if (!m.more) break;
    after = m.items[m.items.length - 1]?.k ?? "";
  }
  assert.deepEqual(seen, "abcdefghijklm".split(""));
});

test("fork parts merge in the caller's order; a part's failures keep its children's indexes", () => {
  const m = mergeFork([
    {
      node: "n2",
      offset: 3,
      count: 2,
      outcome: { ok: true, sandboxes: ["d"], failures: [{ index: 1, code: "vmm_error", message: "x" }] },
    },
    { node: "n1", offset: 0, count: 3, outcome: { ok: true, sandboxes: ["a", "b", "c"], failures: [] } },
  ]);
  assert.deepEqual(m.sandboxes, ["a", "b", "c", "d"]);
  assert.deepEqual(m.failures, [{ index: 4, code: "vmm_error", message: "node n2: x" }]);
});

test("a node that failed its part fails each of its children, naming the node", () => {
  const m = mergeFork(
    [
      { node: "n1", offset: 0, count: 2, outcome: { ok: true, sandboxes: ["a", "b"], failures: [] } },
      {
        node: "n2",
        offset: 2,
        count: 2,
        outcome: { ok: false, code: "timeout", message: "did not answer within 5 ms" },
      },
      {
        node: "n3",
        offset: 4,
        count: 1,
        outcome: {
          ok: false,
          code: "vmm_error",
          message: "every child failed",
          failures: [{ index: 0, code: "vmm_error", message: "the VMM exited" }],
        },
      },
    ],
    [{ index: 5, code: "resource_exhausted", message: "no room" }],
  );
  assert.deepEqual(m.sandboxes, ["a", "b"]);
  assert.deepEqual(m.failures, [
    { index: 2, code: "timeout", message: "node n2: did not answer within 5 ms" },
    { index: 3, code: "timeout", message: "node n2: did not answer within 5 ms" },
    { index: 4, code: "vmm_error", message: "node n3: the VMM exited" },
    { index: 5, code: "resource_exhausted", message: "no room" },
  ]);
});
