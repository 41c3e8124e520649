/**
 * The warm pool's policy and bookkeeping with a fake prepare (no VMs): the host-wide bound spent
 * on the snapshots forked most and most recently, the per-snapshot cap, the memory bound, the
 * drain of idle snapshots, dead members never handed out, and a failed hot warm-up discarded,
 * logged and not retried hot in a loop.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AgentClient } from "../../src/agent/client.js";
import { WarmPool } from "../../src/sandbox/pool.js";
import type { PoolOptions, Prepared } from "../../src/sandbox/pool.js";
import { bump, decayed, poolTargets } from "../../src/sandbox/pool-policy.js";
import type { Usage } from "../../src/sandbox/pool-policy.js";
import type { Logger } from "../../src/util/log.js";
import type { Vm } from "../../src/vmm/vm.js";

const LIMITS = { perTag: 2, max: 8, idleMs: 60_000, halfLifeMs: 60_000 };

test("decay halves a fork's weight each half-life; a fork adds one", () => {
  const u = bump(undefined, 0, 1000);
  assert.deepEqual(u, { score: 1, at: 0 });
  assert.equal(decayed(u, 1000, 1000), 0.5);
  assert.equal(bump(u, 1000, 1000).score, 1.5);
});

test("the host's total goes to the snapshots forked most, then most recently; idle ones get none", () => {
  const usage = new Map<string, Usage>();
  // the base, forked often; then twelve branches each forked once, the newest last
  let u: Usage | undefined;
  for (let t = 0; t < 10; t++) u = bump(u, t * 1000, LIMITS.halfLifeMs);
  usage.set("base", u!);
  for (let i = 0; i < 12; i++) usage.set(`b${i}`, bump(undefined, 10_000 + i * 1000, LIMITS.halfLifeMs));
  const now = 22_000;
  const t = poolTargets(usage, now, LIMITS, () => 40);
  const total = [...t.values()].reduce((a, b) => a + b, 0);
  assert.equal(total, 8, "the host bound, all of it");
  assert.equal(t.get("base"), 2, "the most forked snapshot is served");
  for (const n of t.values()) assert.ok(n <= 2, "the per-snapshot cap");
  // the rest goes to the most recent branches
  assert.deepEqual(
    [...t.keys()].filter((k) => k !== "base"),
    ["b11", "b10", "b9"],
  );
  // a memory bound cuts the total
  const m = poolTargets(usage, now, { ...LIMITS, maxMiB: 100 }, () => 40);
  assert.equal(
    [...m.values()].reduce((a, b) => a + b, 0),
    2,
  );
  // past the idle time nobody gets members
  assert.equal(poolTargets(usage, 22_000 + LIMITS.idleMs + 10_000, LIMITS, () => 40).size, 0);
  // max 0: no pool
  assert.equal(poolTargets(usage, now, { ...LIMITS, max: 0 }, () => 40).size, 0);
});

interface FakeMember extends Prepared {
  kill(): void;
}

/** A pool whose prepare makes fake members (a VMM and an agent that only know whether they are alive). */
async function fakePool(
  opts: Partial<PoolOptions>,
  fail: (tag: string, hot: boolean) => boolean = () => false,
  /** How long making a member of `tag` takes on the fake clock. */
  takes: (tag: string) => number = () => 0,
  /** The snapshot a member is made of (its meta checksum), and a gate its making waits on. */
  of: { checksum: string; gate?: Promise<void> } = { checksum: "c1" },
) {
  const root = await mkdtemp(join(tmpdir(), "forkd-pool-unit-"));
  let clock = 1_000_000;
  const made: { tag: string; hot: boolean }[] = [];
  const killed: string[] = [];
  const warnings: string[] = [];
  const log: Logger = { info: () => undefined, warn: (msg) => warnings.push(msg) };
  let n = 0;
  const prepare = async (tag: string, hot: boolean): Promise<Prepared> => {
    made.push({ tag, hot });
    const checksum = of.checksum;
    await of.gate;
    clock += takes(tag);
    if (fail(tag, hot)) throw new Error(`warm-up of ${tag} failed`);
    const id = `m${n++}`;
    const state = { exited: false, closed: false };
    const vm = {
      get exited() {
        return state.exited;
      },
      pid: 1,
      kill: () => {
        killed.push(id);
        state.exited = true;
        return Promise.resolve();
      },
    } as unknown as Vm;
    const agent = {
      get closed() {
        return state.closed;
      },
      close: () => {
        state.closed = true;
      },
    } as unknown as AgentClient;
    const m: FakeMember = {
      id,
      dir: join(root, id),
      vm,
      agent,
      launchMs: 1,
      hot,
      memMiB: 30,
      checksum,
      kill: () => {
        state.exited = true;
      },
    };
    return m;
  };
  const pool = new WarmPool({ ...LIMITS, hot: true, sweepMs: 3_600_000, ...opts }, prepare, log, () => clock);
  const settle = async () => {
    for (let i = 0; i < 50; i++) await new Promise((r) => setImmediate(r));
  };
  return {
    pool,
    made,
    killed,
    warnings,
    settle,
    advance: (ms: number) => (clock += ms),
    async close() {
      await pool.close();
      await rm(root, { recursive: true, force: true });
    },
  };
}

test("a tree search of twelve branches each forked once holds at most FORKD_POOL_MAX members", async () => {
  const f = await fakePool({ max: 8 });
  try {
    for (let i = 0; i < 12; i++) {
      f.pool.use(`b${i}`);
      f.pool.refill();
      await f.settle();
      const s = f.pool.state();
      assert.ok(s.total <= 8, `after branch ${i}: ${s.total} members`);
      f.advance(1000);
    }
    const s = f.pool.state();
    assert.equal(s.total, 8);
    assert.equal(s.hot, 8);
    assert.deepEqual(
      Object.entries(s.tags)
        .filter(([, t]) => t.ready > 0)
        .map(([k]) => k)
        .sort(),
      ["b10", "b11", "b8", "b9"],
      "the most recent ones",
    );
    // nobody forks any more: after the idle time every member is gone
    f.advance(LIMITS.idleMs + 1);
    f.pool.refill();
    await f.settle();
    assert.equal(f.pool.state().total, 0);
    assert.equal(f.killed.length, f.made.length, "every member made was killed");
  } finally {
    await f.close();
  }
});

test("a snapshot going idle while members are made frees its room before another takes it", async () => {
  const f = await fakePool({ max: 3 }, undefined, (tag) => (tag === "b0" ? 2_000 : 0));
  try {
    f.pool.use("base");
    f.pool.refill();
    await f.settle();
    assert.equal(f.pool.status().base, 2);
    f.advance(LIMITS.idleMs - 1_000);
    // the branch is forked; while its member is made the base passes its idle time
    f.pool.use("b0");
    f.pool.refill();
    await f.settle();
    const s = f.pool.state();
    assert.ok(s.total <= 3, `at most 3 members (${JSON.stringify(s.tags)})`);
    assert.equal(s.tags.base?.ready ?? 0, 0, "the idle base was drained");
    assert.equal(s.tags.b0?.ready, 2);
  } finally {
    await f.close();
  }
});

test("a member whose VMM died is never handed out; drain empties a snapshot", async () => {
  const f = await fakePool({});
  try {
    f.pool.use("base");
    f.pool.refill();
    await f.settle();
    assert.equal(f.pool.status().base, 2);
    const s = f.pool.state();
    assert.equal(s.tags.base?.target, 2);
    const first = f.pool.take("base") as FakeMember;
    assert.ok(first.hot);
    // the other one dies while waiting
    const list = (f.pool as unknown as { ready: Map<string, FakeMember[]> }).ready.get("base")!;
    list[0]!.kill();
    assert.equal(f.pool.take("base"), null, "a dead member is passed over");
    f.pool.refill();
    await f.settle();
    assert.equal(f.pool.status().base, 2);
    await f.pool.drain("base");
    assert.equal(f.pool.status().base, undefined);
    assert.equal(f.pool.state().total, 0);
  } finally {
    await f.close();
  }
});

test("a failed hot warm-up is discarded and logged, and the snapshot is not retried hot in a loop", async () => {
  const f = await fakePool({ retryMs: 5_000 }, (_tag, hot) => hot);
  try {
    f.pool.use("base");
    f.pool.refill();
    await f.settle();
    assert.deepEqual(f.made, [{ tag: "base", hot: true }], "one attempt, then it waits");
    assert.equal(f.warnings.length, 1);
    // more forks do not retry before the back-off
    f.pool.use("base");
    f.pool.refill();
    await f.settle();
    assert.equal(f.made.length, 1);
    // after it: cold members
    f.advance(5_001);
    f.pool.refill();
    await f.settle();
    assert.deepEqual(
      f.made.slice(1).map((m) => m.hot),
      [false, false],
    );
    assert.equal(f.pool.state().cold, 2);
  } finally {
    await f.close();
  }
});

test("FORKD_POOL_MAX=0 disables the pool", async () => {
  const f = await fakePool({ max: 0 });
  try {
    f.pool.use("base");
    f.pool.refill();
    await f.settle();
    assert.equal(f.made.length, 0);
    assert.equal(f.pool.take("base"), null);
  } finally {
    await f.close();
  }
});

test("a member of an older snapshot of a tag, or one made across a drain of it, is never handed out", async () => {
  const of: { checksum: string; gate?: Promise<void> } = { checksum: "old" };
  const f = await fakePool({ max: 8 }, undefined, undefined, of);
  try {
    f.pool.use("t");
    f.pool.refill();
    await f.settle();
    assert.equal(f.pool.status().t, 2, "two members of the old snapshot");
    // The tag is made again (deleted and re-created, or its memory rewritten): another checksum.
    assert.equal(f.pool.take("t", "new"), null, "no member of the old snapshot is handed out");
    assert.equal(f.killed.length, 2, "both discarded");
    // A member still being made when its tag is drained is discarded once made.
    let open: () => void = () => undefined;
    of.gate = new Promise<void>((r) => (open = r));
    of.checksum = "new";
    f.pool.use("t");
    f.pool.refill();
    await f.settle();
    await f.pool.drain("t");
    f.pool.use("t"); // forked again meanwhile: wanted again, but the member in flight predates the drain
    open();
    await f.settle();
    const p = f.pool.take("t", "new");
    assert.ok(p === null || !f.killed.includes(p.id), "never a killed member");
    assert.ok(f.killed.length >= 3, "the member made across the drain was discarded");
  } finally {
    of.gate = undefined;
    await f.close();
  }
});
