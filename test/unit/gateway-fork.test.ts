/**
 * Forks through the gateway (src/gateway/fork.ts) over a fake etcd and fake nodes: placed and
 * fanned out with the caller's token, merged into one ForkResult with the caller's indexes; a
 * node that hangs or fails names itself in its children's failures; a node never reached gives
 * its children to another; the tenant's quota holds across the cluster.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { fakeCluster, until } from "../helpers/fake-cluster.js";
import { call } from "../helpers/gateway.js";

interface ForkReply {
  sandboxes: { id: string; node: string }[];
  failures: { index: number; code: string; message: string }[];
}

test("fork -n 30 of a snapshot held on one node spreads over three; each node got its part and the caller's token", async () => {
  const c = await fakeCluster();
  try {
    const r = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "bob-token",
      body: { snapshot_tag: "app", n: 30, metadata: { run: "1" } },
    });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    assert.equal(r.body.sandboxes.length, 30);
    assert.deepEqual(r.body.failures, []);
    const per = new Map<string, number>();
    for (const sb of r.body.sandboxes) per.set(sb.node, (per.get(sb.node) ?? 0) + 1);
    assert.deepEqual([...per.keys()].sort(), ["n1", "n2", "n3"]);
    for (const n of c.nodes) {
      const forks = n.seen.filter((s) => s.method === "POST" && s.path === "/v1/sandboxes");
      assert.equal(forks.length, 1);
      const body = JSON.parse(forks[0]?.body ?? "{}") as {
        n: number;
        snapshot_tag: string;
        metadata: unknown;
      };
      assert.equal(body.n, per.get(n.o.id));
      assert.equal(body.snapshot_tag, "app");
      assert.deepEqual(body.metadata, { run: "1" });
      assert.equal(forks[0]?.headers.authorization, "Bearer bob-token");
    }
    // The holder is the first part: the caller's first children are its.
    assert.equal(r.body.sandboxes[0]?.node, "n1");
    assert.equal(await c.kv.count(c.keys.byOwner("bob")), 30);
    // Each child is reachable through the gateway at once (its record may not be mirrored yet).
    const one = r.body.sandboxes[29]!;
    const got = await call<{ node: string }>(c.gw.url, "GET", `/v1/sandboxes/${one.id}/files/stat?path=/x`, {
      token: "bob-token",
    });
    assert.equal(got.body.node, one.node);
  } finally {
    await c.close();
  }
});

test("a node whose part hangs fails its children, named, within the bound; the others answer", async () => {
  const c = await fakeCluster({ bounds: { forkMs: 500 } });
  try {
    c.nodes[1]!.hang = true;
    const t0 = Date.now();
    const r = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "bob-token",
      body: { snapshot_tag: "app", n: 9 },
    });
    assert.ok(Date.now() - t0 < 3000);
    assert.equal(r.status, 201);
    const failed = r.body.failures;
    assert.ok(failed.length >= 1 && failed.length < 9, JSON.stringify(r.body));
    for (const f of failed) {
      assert.equal(f.code, "timeout");
      assert.match(f.message, /^node n2: /);
    }
    assert.equal(r.body.sandboxes.length + failed.length, 9);
    // Indexes are the caller's: n2's children follow n1's.
    const idx = failed.map((f) => f.index);
    assert.deepEqual(
      idx,
      [...idx].sort((a, b) => a - b),
    );
    assert.ok(idx.every((i) => i >= 0 && i < 9));
  } finally {
    await c.close();
  }
});

test("children a node fails keep their index; a part failing all its children gives the node's own failures", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    c.nodes[0]!.failLast = 1;
    c.nodes[1]!.failLast = 100;
    const r = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "bob-token",
      body: { snapshot_tag: "app", n: 6 },
    });
    assert.equal(r.status, 201);
    const n1 = c.nodes[0]!.seen.find((s) => s.path === "/v1/sandboxes");
    const k = (JSON.parse(n1?.body ?? "{}") as { n: number }).n;
    assert.equal(r.body.sandboxes.length, k - 1);
    assert.deepEqual(
      r.body.failures.map((f) => [f.index, f.code, f.message.split(":")[0]]),
      [
        [k - 1, "vmm_error", "node n1"],
        ...Array.from({ length: 6 - k }, (_, i) => [k + i, "vmm_error", "node n2"]),
      ],
    );
    // Every child failing: an error with the first failure's code, every failure in its details.
    c.nodes[0]!.failLast = 100;
    const all = await call<{ error: { code: string; message: string; details: { failures: unknown[] } } }>(
      c.gw.url,
      "POST",
      "/v1/sandboxes",
      { token: "bob-token", body: { snapshot_tag: "app", n: 4 } },
    );
    assert.equal(all.status, 500);
    assert.equal(all.body.error.code, "vmm_error");
    assert.match(all.body.error.message, /^every child failed: node n\d: /);
    assert.equal(all.body.error.details.failures.length, 4);
  } finally {
    await c.close();
  }
});

test("children of a node never reached go to another node once", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    // n2 is dead but its record is still in etcd (its lease has not expired yet).
    const n2 = c.nodes[1]!;
    n2.o.onKill = async () => undefined;
    n2.kill();
    const r = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "bob-token",
      body: { snapshot_tag: "app", n: 6 },
    });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    assert.equal(r.body.sandboxes.length, 6);
    assert.ok(r.body.sandboxes.every((s) => s.node === "n1"));
    assert.equal(c.nodes[0]!.seen.filter((s) => s.path === "/v1/sandboxes").length, 2);
  } finally {
    await c.close();
  }
});

test("forks reuse the gateway's open connection to each node; a part broken on one fails its children, never sent again", async () => {
  const c = await fakeCluster({ node: { maxSandboxes: 200 } });
  try {
    for (let i = 0; i < 3; i++) {
      const r = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
        token: "bob-token",
        body: { snapshot_tag: "app", n: 30 },
      });
      assert.equal(r.body.sandboxes.length, 30, JSON.stringify(r.body));
    }
    for (const n of c.nodes) {
      assert.equal(n.seen.filter((s) => s.path === "/v1/sandboxes").length, 3);
      assert.equal(n.connections, 1, `${n.o.id}: one connection for its three parts`);
    }
    // n2 takes its part on the open connection, then drops it unanswered: it may have acted.
    const n2 = c.nodes[1]!;
    n2.hang = true;
    const before = n2.seen.length;
    const pending = call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "bob-token",
      body: { snapshot_tag: "app", n: 30 },
    });
    await until(() => n2.seen.length > before, 5000, "n2's part");
    n2.o.onKill = async () => undefined;
    n2.kill();
    const r = await pending;
    assert.equal(r.status, 201, JSON.stringify(r.body));
    assert.ok(r.body.failures.length > 0);
    for (const f of r.body.failures) {
      assert.equal(f.code, "unavailable");
      assert.match(f.message, /^node n2: /);
    }
    assert.ok(r.body.sandboxes.every((s) => s.node !== "n2"));
    assert.equal(r.body.sandboxes.length + r.body.failures.length, 30);
    for (const n of [c.nodes[0]!, c.nodes[2]!])
      assert.equal(
        n.seen.filter((s) => s.path === "/v1/sandboxes").length,
        4,
        `${n.o.id}: its own part only`,
      );
  } finally {
    await c.close();
  }
});

test("children a node answered for count against its room until its record counts them: no node is sent past its bound", async () => {
  const c = await fakeCluster({ nodes: 2, node: { maxSandboxes: 10 } });
  try {
    for (const n of c.nodes) n.recordLags = true; // their records still say 0 running
    for (let i = 0; i < 2; i++) {
      const r = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
        token: "bob-token",
        body: { snapshot_tag: "app", n: 10 },
      });
      assert.equal(r.body.sandboxes.length, 10, JSON.stringify(r.body));
    }
    for (const n of c.nodes) assert.equal(n.children.size, 10, `${n.o.id} got as many as its bound`);
    const full = await call<{ error: { code: string } }>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "bob-token",
      body: { snapshot_tag: "app" },
    });
    assert.equal(full.body.error.code, "resource_exhausted");
    // Once a node's record is rewritten, it is what counts.
    for (const n of c.nodes) {
      n.recordLags = false;
      await n.publish();
    }
    await until(
      () => c.gw.running.gateway.assignments.of("n1") === 0,
      5000,
      "n1's answered children released",
    );
    assert.equal(c.gw.running.gateway.assignments.of("n2"), 0);
  } finally {
    await c.close();
  }
});

test("the tenant's quota holds across nodes; a refusal reaches no node", async () => {
  const c = await fakeCluster();
  try {
    const a = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "alice-token",
      body: { snapshot_tag: "app", n: 4 },
    });
    assert.equal(a.status, 201);
    const before = c.nodes.map((n) => n.seen.length);
    const b = await call<{ error: { code: string; details: { limit: number; existing: number } } }>(
      c.gw.url,
      "POST",
      "/v1/sandboxes",
      { token: "alice-token", body: { snapshot_tag: "app", n: 2 } },
    );
    assert.equal(b.status, 429);
    assert.equal(b.body.error.code, "resource_exhausted");
    assert.deepEqual(b.body.error.details, { limit: 5, existing: 4 });
    assert.deepEqual(
      c.nodes.map((n) => n.seen.length),
      before,
    );
    // Two gateways admitting at once: 1 slot left, one of them gets it.
    const other = await c.another();
    const both = await Promise.all(
      [c.gw.url, other.url].map((u) =>
        call(u, "POST", "/v1/sandboxes", { token: "alice-token", body: { snapshot_tag: "app", n: 1 } }),
      ),
    );
    assert.deepEqual(both.map((x) => x.status).sort(), [201, 429]);
    assert.equal(await c.kv.count(c.keys.byOwner("alice")), 5);
    assert.equal(await c.kv.count(`${c.keys.prefix}reservations/`), 0);
  } finally {
    await c.close();
  }
});

test("a tag is read in the caller's namespace; one it cannot see, or a bad body, is refused before any node", async () => {
  const c = await fakeCluster({ nodes: 1 });
  try {
    const own = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "alice-token",
      body: { snapshot_tag: "own" },
    });
    assert.equal(own.status, 201);
    const hidden = await call<{ error: { code: string; message: string } }>(
      c.gw.url,
      "POST",
      "/v1/sandboxes",
      {
        token: "bob-token",
        body: { snapshot_tag: "alice/own" },
      },
    );
    assert.equal(hidden.status, 404);
    assert.equal(hidden.body.error.message, "no snapshot tagged alice/own");
    for (const body of [{ n: 2 }, { snapshot_tag: "app", n: 0 }, { snapshot_tag: "app", n: 1.5 }]) {
      const r = await call(c.gw.url, "POST", "/v1/sandboxes", { token: "bob-token", body });
      assert.equal(r.status, 400, JSON.stringify(body));
    }
    assert.equal(c.nodes[0]!.seen.filter((s) => s.path === "/v1/sandboxes").length, 1);
    const anon = await call(c.gw.url, "POST", "/v1/sandboxes", { body: { snapshot_tag: "app" } });
    assert.equal(anon.status, 401);
    assert.equal(anon.headers.get("www-authenticate"), 'Bearer realm="forkd"');
  } finally {
    await c.close();
  }
});

test("a snapshot of another machine is never placed; no node of its machine is a 503", async () => {
  const c = await fakeCluster({ nodes: 2, node: { machine: { accel: "kvm", qemu: "9.0", cpu: "host" } } });
  try {
    const r = await call<{ error: { code: string; message: string } }>(c.gw.url, "POST", "/v1/sandboxes", {
      token: "bob-token",
      body: { snapshot_tag: "app" },
    });
    assert.equal(r.status, 503);
    assert.match(r.body.error.message, /no node of the cluster takes work on app's machine/);
    await until(() => c.nodes.every((n) => !n.seen.some((s) => s.path === "/v1/sandboxes")));
  } finally {
    await c.close();
  }
});
