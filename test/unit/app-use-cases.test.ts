/**
 * The application layer (src/app) without VMs: forking as a caller (scope, quota, metrics, and
 * the one answer when every child fails: the first child's own code), branch, branch-then-fork
 * (E2B's fork), pause/resume/kill as a caller, snapshot deletion as a caller, the tenant
 * predicates, admission and the call record. The sandbox service's fork, branch and kill are
 * stubbed: what is tested is what the app layer adds around them.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { Caller } from "../../src/access/caller.js";
import { LOCAL } from "../../src/access/caller.js";
import {
  admit,
  admittedBy,
  authFailed,
  authRefusal,
  isMutating,
  retryAfter,
} from "../../src/app/admission.js";
import { branchAs } from "../../src/app/branch.js";
import { branchThenFork } from "../../src/app/branch-fork.js";
import { recordCall, startCall } from "../../src/app/call-record.js";
import { forkAs } from "../../src/app/fork.js";
import { killAs, pauseAs } from "../../src/app/lifecycle.js";
import { heldBy, liveSandbox, mayHold, sandboxOf } from "../../src/app/scope.js";
import type { Services } from "../../src/app/services.js";
import { deleteSnapshotAs } from "../../src/app/snapshots.js";
import type { ForkOptions, ForkResult } from "../../src/sandbox/fork.js";
import type { ReadonlySandbox } from "../../src/sandbox/sandbox.js";
import type { SandboxService } from "../../src/sandbox/service.js";
import { ForkdError } from "../../src/util/errors.js";
import { fakeSnapshot } from "../helpers/snapshots.js";
import { testServices } from "../helpers/services.js";

const tenant = (name: string, maxSandboxes: number | null = null): Caller => ({
  name,
  tenant: name,
  tokenId: `t-${name}`,
  limited: true,
  maxSandboxes,
  credential: `token:t-${name}`,
});

const sandbox = (id: string, owner: string | null, state = "running", extra: object = {}): ReadonlySandbox =>
  ({
    state,
    record: {
      id,
      owner,
      tag: "base",
      metadata: { m: id },
      env: { E: "1" },
      timings: { totalMs: 250 },
      ...extra,
    },
  }) as unknown as ReadonlySandbox;

interface Recorded {
  fork: number[];
  branchPause: number[];
  failure: string[];
  http: string[];
}

/** testServices with the sandbox service's operations stubbed and the metrics recorded. */
async function fixture(stubs: Partial<Record<keyof SandboxService, unknown>> = {}) {
  const t = await testServices();
  const recorded: Recorded = { fork: [], branchPause: [], failure: [], http: [] };
  const sandboxes = Object.assign(Object.create(t.services.sandboxes) as SandboxService, stubs);
  const s: Services = {
    ...t.services,
    sandboxes,
    metrics: {
      ...t.services.metrics,
      fork: (x) => void recorded.fork.push(x),
      branchPause: (x) => void recorded.branchPause.push(x),
      failure: (op, reason) => void recorded.failure.push(`${op}:${reason}`),
      http: (route, method, code) => void recorded.http.push(`${method} ${route} ${code}`),
    },
  };
  return { t, s, recorded };
}

const failed = (...codes: ForkdError["code"][]): ForkResult => ({
  sandboxes: [],
  failures: codes.map((code, index) => ({ index, code, message: `child ${index}: ${code}` })),
});

test("forkAs: when every child fails the answer is the first child's own code, every failure in the metrics", async () => {
  for (const codes of [["timeout"], ["resource_exhausted", "vmm_error"], ["guest_error"]] as const) {
    const { t, s, recorded } = await fixture({ fork: async () => failed(...codes) });
    try {
      await assert.rejects(forkAs(s, LOCAL, "base", codes.length, {}), (e: unknown) => {
        assert.ok(e instanceof ForkdError);
        assert.equal(e.code, codes[0], "the first child's code, not a generic one");
        assert.match(e.message, /^every child failed: child 0/);
        assert.equal((e.details.failures as unknown[]).length, codes.length);
        return true;
      });
      assert.deepEqual(
        recorded.failure,
        codes.map((c) => `fork:${c}`),
      );
    } finally {
      await t.cleanup();
    }
  }
});

test("forkAs: a tenant forks a shared snapshot as its own, within its quota, released after", async () => {
  const calls: { tag: string; n: number; opts: ForkOptions }[] = [];
  const { t, s, recorded } = await fixture({
    fork: async (tag: string, n: number, opts: ForkOptions) => {
      calls.push({ tag, n, opts });
      return {
        sandboxes: [sandbox("sb-a1", "alice")],
        failures: [{ index: 1, code: "timeout", message: "slow" }],
      };
    },
    list: () => [sandbox("sb-a0", "alice"), sandbox("sb-b0", "bob"), sandbox("sb-ax", "alice", "exited")],
  });
  try {
    await fakeSnapshot(t.services.store, "base", null);
    const alice = tenant("alice", 3);
    const r = await forkAs(s, alice, "base", 2, { metadata: { k: "v" } });
    assert.equal(r.sandboxes.length, 1, "some failing is not an error: the failures are listed");
    assert.deepEqual([calls[0]?.tag, calls[0]?.n, calls[0]?.opts.owner], ["base", 2, "alice"]);
    assert.deepEqual(recorded.fork, [0.25]);
    assert.deepEqual(recorded.failure, ["fork:timeout"]);
    // 1 held (the exited one is not counted) + 2 = 3: at the limit; the reservation was released.
    await forkAs(s, alice, "base", 2, {});
    await assert.rejects(forkAs(s, alice, "base", 3, {}), { code: "resource_exhausted" });
    assert.equal(calls.length, 2, "refused by the quota before any fork");
    // Another tenant's snapshot does not exist for it.
    await fakeSnapshot(t.services.store, "bob/mine", "bob");
    await assert.rejects(forkAs(s, alice, "bob/mine", 1, {}), { code: "not_found" });
    // A door names a snapshot the caller cannot fork its own way (E2B: "template … not found").
    const unknown = () => new ForkdError("not_found", "template gone");
    await assert.rejects(forkAs(s, alice, "bob/mine", 1, {}, unknown), { message: "template gone" });
    await assert.rejects(forkAs(s, alice, "Bad Tag!", 1, {}, unknown), { message: "template gone" });
  } finally {
    await t.cleanup();
  }
});

test("forkAs on a node of a cluster: a tenant's fork is reserved across the cluster unless a gateway admitted it", async () => {
  const { t, s } = await fixture({
    fork: async () => ({ sandboxes: [sandbox("sb-a1", "alice")], failures: [] }),
    list: () => [],
  });
  const reserved: string[] = [];
  let released = 0;
  let full = false;
  const node: Services = {
    ...s,
    cluster: {
      admits: (h) => h === "Bearer the-cluster's",
      reserve: async (tenant, max, n) => {
        if (full) throw new ForkdError("resource_exhausted", `${tenant} holds ${max} in the cluster`);
        reserved.push(`${tenant} ${max} ${n}`);
        return { release: async () => void released++ };
      },
    },
  };
  try {
    await fakeSnapshot(t.services.store, "base", null);
    const alice = tenant("alice", 3);
    // Directly at the node: reserved across the cluster, released once the fork answered.
    await forkAs(node, alice, "base", 2, {});
    assert.deepEqual([reserved, released], [["alice 3 2"], 1]);
    // Through a gateway (its header, checked): reserved there, not again here.
    const viaGateway = admittedBy(node, alice, "Bearer the-cluster's");
    assert.equal(viaGateway.admitted, true);
    await forkAs(node, viaGateway, "base", 1, {});
    assert.deepEqual(reserved, ["alice 3 2"]);
    // A forged header is no gateway's; an admin and a tenant without a limit are not reserved.
    assert.equal(admittedBy(node, alice, "Bearer guess").admitted, undefined);
    assert.equal(admittedBy(s, alice, "Bearer the-cluster's").admitted, undefined, "a daemon alone");
    await forkAs(node, LOCAL, "base", 1, {});
    await forkAs(node, tenant("carol"), "base", 1, {});
    assert.equal(reserved.length, 1);
    // The cluster full for the tenant: refused before any fork, nothing left reserved.
    full = true;
    await assert.rejects(forkAs(node, alice, "base", 1, {}), { code: "resource_exhausted" });
    await forkAs(node, viaGateway, "base", 1, {});
  } finally {
    await t.cleanup();
  }
});

test("forkAs: the fork's own bad-input error is not taken for an unknown snapshot", async () => {
  const { t, s } = await fixture({
    fork: async () => {
      throw new ForkdError("invalid_argument", "env too large");
    },
  });
  try {
    await fakeSnapshot(t.services.store, "base", null);
    const unknown = () => new ForkdError("not_found", "template gone");
    await assert.rejects(forkAs(s, tenant("alice"), "base", 1, {}, unknown), {
      code: "invalid_argument",
      message: "env too large",
    });
  } finally {
    await t.cleanup();
  }
});

test("tenant predicates: mayHold, heldBy, sandboxOf and liveSandbox answer one not_found for missing and foreign", async () => {
  const all = [sandbox("sb-a", "alice"), sandbox("sb-b", "bob"), sandbox("sb-x", "alice", "exited")];
  const get = (id: string) => {
    const sb = all.find((x) => x.record.id === id);
    if (!sb) throw new ForkdError("not_found", `no sandbox ${id}`, { id });
    return sb;
  };
  const { t, s } = await fixture({ list: () => all, get });
  try {
    const alice = tenant("alice");
    assert.equal(mayHold(alice, "alice"), true);
    assert.equal(mayHold(alice, null), false, "an admin's sandbox is not a tenant's");
    assert.equal(mayHold(LOCAL, "bob"), true);
    assert.equal(heldBy(s, "alice"), 1);
    assert.equal(sandboxOf(s, alice, "sb-x").record.id, "sb-x", "an exited one is still its own");
    for (const id of ["sb-b", "sb-none"])
      assert.throws(
        () => sandboxOf(s, alice, id),
        (e: unknown) => {
          assert.ok(e instanceof ForkdError);
          assert.deepEqual([e.code, e.message], ["not_found", `no sandbox ${id}`]);
          return true;
        },
      );
    assert.throws(() => liveSandbox(s, alice, "sb-x"), { code: "not_found", message: "no sandbox sb-x" });
  } finally {
    await t.cleanup();
  }
});

test("pause and kill as a caller: another tenant's sandbox is not found and never touched", async () => {
  const touched: string[] = [];
  const all = [sandbox("sb-a", "alice"), sandbox("sb-b", "bob")];
  const { t, s } = await fixture({
    list: () => all,
    get: (id: string) => all.find((x) => x.record.id === id)!,
    kill: async (id: string) => void touched.push(`kill ${id}`),
    pause: async (id: string) => {
      touched.push(`pause ${id}`);
      return all[0];
    },
  });
  try {
    const alice = tenant("alice");
    await assert.rejects(killAs(s, alice, "sb-b"), { code: "not_found" });
    await assert.rejects(pauseAs(s, alice, "sb-b"), { code: "not_found" });
    await killAs(s, alice, "sb-a");
    await pauseAs(s, LOCAL, "sb-b");
    assert.deepEqual(touched, ["kill sb-a", "pause sb-b"]);
  } finally {
    await t.cleanup();
  }
});

test("branchAs: an admin's plain tag for a tenant's sandbox is in the tenant's namespace; the pause is recorded", async () => {
  const branched: unknown[] = [];
  const { t, s, recorded } = await fixture({
    get: () => sandbox("sb-a", "alice"),
    branch: async (id: string, tag: string | undefined, wait: boolean, priv: boolean) => {
      branched.push([id, tag, wait, priv]);
      return { tag: tag ?? "alice/br-1", status: "ready", pauseMs: 40, privateBytes: 0, snapshot: null };
    },
  });
  try {
    await branchAs(s, LOCAL, "sb-a", "keep", { wait: true });
    await branchAs(s, tenant("alice"), "sb-a", undefined, { wait: false, private: true });
    assert.deepEqual(branched, [
      ["sb-a", "alice/keep", true, false],
      ["sb-a", undefined, false, true],
    ]);
    assert.deepEqual(recorded.branchPause, [0.04, 0.04]);
    await assert.rejects(branchAs(s, tenant("bob"), "sb-a", "x", { wait: true }), { code: "not_found" });
  } finally {
    await t.cleanup();
  }
});

test("branchThenFork: one private branch of the running source; children inherit it; failures reported, not thrown", async () => {
  const src = sandbox("sb-a", "alice", "running", {
    onDeadline: "pause",
    network: { mode: "netns", egress: { mode: "deny", allow: [], dns: false }, expose: [{ port: 80 }] },
  });
  const calls: unknown[] = [];
  const { t, s, recorded } = await fixture({
    list: () => [src],
    get: () => src,
    branch: async (id: string, tag: string, wait: boolean, priv: boolean) => {
      calls.push(["branch", id, tag.replace(/[0-9a-f]{12}$/, "X"), wait, priv]);
      return { tag, status: "ready", pauseMs: 10, privateBytes: 0, snapshot: null };
    },
    fork: async (_tag: string, n: number, opts: ForkOptions) => {
      calls.push([
        "fork",
        n,
        opts.owner,
        opts.metadata,
        opts.env,
        opts.onDeadline,
        opts.network,
        opts.deadlineMs,
      ]);
      return { sandboxes: [], failures: [{ index: 0, code: "vmm_error", message: "no" }] };
    },
  });
  try {
    const r = await branchThenFork(s, tenant("alice"), "sb-a", 1, () => ({ deadlineMs: 5000 }));
    assert.equal(r.children.failures.length, 1);
    assert.deepEqual(calls, [
      ["branch", "sb-a", "alice/e2b-fork-X", true, true],
      [
        "fork",
        1,
        "alice",
        { m: "sb-a" },
        { E: "1" },
        "pause",
        { mode: "netns", egress: { mode: "deny", allow: [], dns: false }, expose: [] },
        5000,
      ],
    ]);
    assert.deepEqual([recorded.branchPause, recorded.failure], [[0.01], ["fork:vmm_error"]]);
    const paused = sandbox("sb-p", "alice", "paused");
    const f2 = await fixture({ get: () => paused });
    try {
      await assert.rejects(
        branchThenFork(f2.s, tenant("alice"), "sb-p", 1, () => ({})),
        { code: "conflict" },
      );
    } finally {
      await f2.t.cleanup();
    }
  } finally {
    await t.cleanup();
  }
});

test("deleteSnapshotAs: a tenant deletes its own; a shared one or a reserved tag is forbidden; a foreign one not found", async () => {
  const { t, s } = await fixture();
  try {
    await fakeSnapshot(t.services.store, "shared", null);
    await fakeSnapshot(t.services.store, "alice/mine", "alice");
    await fakeSnapshot(t.services.store, "bob/theirs", "bob");
    const alice = tenant("alice");
    await assert.rejects(deleteSnapshotAs(s, alice, "shared", { cascade: false, force: false }), {
      code: "forbidden",
    });
    await assert.rejects(deleteSnapshotAs(s, alice, "base", { cascade: false, force: false }), {
      code: "forbidden",
      message: /reserved/,
    });
    await assert.rejects(deleteSnapshotAs(s, alice, "bob/theirs", { cascade: false, force: false }), {
      code: "not_found",
    });
    await deleteSnapshotAs(s, alice, "mine", { cascade: false, force: false });
    assert.equal(await t.services.store.has("alice/mine"), false);
    // A failed creation of its own is the tenant's to delete too (E2B's DELETE /templates/{id} as REST's).
    const started = new Date().toISOString();
    await t.services.store.recordFailed(
      { tag: "alice/broke", started, source: null, owner: "alice" },
      new Error("boom"),
    );
    await t.services.store.recordFailed(
      { tag: "bob/broke", started, source: null, owner: "bob" },
      new Error("boom"),
    );
    await assert.rejects(deleteSnapshotAs(s, alice, "bob/broke", { cascade: false, force: false }), {
      code: "not_found",
    });
    await deleteSnapshotAs(s, alice, "broke", { cascade: false, force: false });
    assert.equal(await t.services.store.lookup("alice/broke"), undefined);
    assert.equal((await t.services.store.lookup("bob/broke"))?.status, "failed");
  } finally {
    await t.cleanup();
  }
});

test("killAs (REST's kill as E2B's): fork snapshots past their grace that no child uses are reaped after it", async () => {
  const old = new Date(Date.now() - 60 * 60_000).toISOString();
  const fresh = new Date().toISOString();
  const deleted: string[] = [];
  const { t, s } = await fixture({
    get: () => sandbox("sb-a", "alice"),
    kill: async () => undefined,
    countByTag: (tag: string) => (tag === "alice/e2b-fork-used" ? 1 : 0),
  });
  try {
    const metas = [
      { tag: "alice/e2b-fork-idle", created: old },
      { tag: "alice/e2b-fork-used", created: old },
      { tag: "alice/e2b-fork-young", created: fresh },
      { tag: "alice/app", created: old },
    ];
    const reaped = new Promise<void>((resolve) => {
      const r: Services = {
        ...s,
        store: Object.assign(Object.create(s.store) as Services["store"], { list: async () => metas }),
        snapshots: Object.assign(Object.create(s.snapshots) as Services["snapshots"], {
          delete: async (tag: string) => {
            deleted.push(tag);
            resolve();
            return {};
          },
        }),
      };
      void killAs(r, tenant("alice"), "sb-a");
    });
    await Promise.race([
      reaped,
      new Promise((_, reject) => setTimeout(() => reject(new Error("no reap after the kill")), 5000).unref()),
    ]);
    await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(deleted, ["alice/e2b-fork-idle"]);
  } finally {
    await t.cleanup();
  }
});

test("admission: unlimited callers take no slot; a limited one is refused past its limits with a Retry-After", async () => {
  const t = await testServices({ rate: { rps: 0, burst: 1, maxInflight: 1 } });
  try {
    const s = t.services;
    assert.equal(admit(s, LOCAL, true), null);
    const alice = tenant("alice");
    const release = admit(s, alice, false);
    assert.ok(release);
    assert.throws(
      () => admit(s, alice, false),
      (e: unknown) => e instanceof ForkdError && e.code === "rate_limited" && retryAfter(e) !== undefined,
    );
    release();
    assert.ok(admit(s, alice, false));
    assert.deepEqual(["GET", "POST", "DELETE"].map(isMutating), [false, true, true]);
  } finally {
    await t.cleanup();
  }
});

test("admission: an address past its failed authentications is refused before any credential is checked", async () => {
  const t = await testServices({ authFailures: { rps: 0.001, burst: 2 } });
  try {
    const s = t.services;
    assert.equal(authRefusal(s, "10.0.0.1"), null);
    authFailed(s, "10.0.0.1");
    authFailed(s, "10.0.0.1");
    authFailed(s, "10.0.0.1");
    const e = authRefusal(s, "10.0.0.1");
    assert.equal(e?.code, "rate_limited");
    assert.ok(e && Number(retryAfter(e)) > 0);
    assert.equal(authRefusal(s, "10.0.0.2"), null, "per address");
  } finally {
    await t.cleanup();
  }
});

test("recordCall: metrics when the door keeps series; an audit line only for an audited action", async () => {
  const { t, s, recorded } = await fixture();
  try {
    const alice = tenant("alice");
    const call = startCall();
    const base = {
      caller: alice,
      remote: "10.0.0.1",
      method: "POST",
      status: 500,
      result: "vmm_error",
      target: {},
    };
    recordCall(s, call, {
      ...base,
      action: "POST /v1/x",
      series: { route: "/v1/x", failure: { op: "x", reason: "vmm_error" } },
    });
    recordCall(s, startCall(), { ...base, method: "GET", status: 200, result: "ok", action: null });
    assert.deepEqual(recorded.http, ["POST /v1/x 500"]);
    assert.deepEqual(recorded.failure, ["x:vmm_error"]);
    assert.equal(t.audited.length, 1);
    assert.deepEqual(
      [t.audited[0]?.action, t.audited[0]?.tenant, t.audited[0]?.result, t.audited[0]?.request_id],
      ["POST /v1/x", "alice", "vmm_error", call.requestId],
    );
  } finally {
    await t.cleanup();
  }
});
