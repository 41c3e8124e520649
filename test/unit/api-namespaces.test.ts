/**
 * Snapshot tags by namespace through the REST API, without VMs (issue 23, finding 9): two
 * tenants hold one tag, each its own, and an admin names both; a reserved tag (E2B's default)
 * is refused to a tenant for creation, deletion and as a target, with one answer whether or not
 * a snapshot has it, and reads the admins' shared snapshot; a listing shows a tenant its own and
 * the shared ones; and nothing a tenant is answered depends on another tenant's tags. A creation
 * is asked with an unknown template: its 400 says the tag was resolved (a refused tag is a 403 or
 * 409 first), without a VM. Replies are checked against the committed OpenAPI document.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createApp } from "../../src/api/app.js";
import { contractValidator } from "../helpers/contract.js";
import { fakeSnapshot } from "../helpers/snapshots.js";
import { testServices } from "../helpers/services.js";
import type { TestServices } from "../helpers/services.js";

const ADMIN = "t".repeat(20) + "0123456789abcdef";
let t: TestServices;
let app: ReturnType<typeof createApp>;
const tok: Record<string, string> = {};

before(async () => {
  t = await testServices();
  app = createApp(t.services, t.tcp(ADMIN));
  for (const tenant of ["alice", "bob", "carol"])
    tok[tenant] = (await t.services.tokens.create({ tenant, scope: "tenant" })).token;
  tok.admin = ADMIN;
  await fakeSnapshot(t.services.store, "python", null);
});

after(async () => {
  await t.cleanup();
});

interface Reply {
  status: number;
  body: Record<string, unknown> & { error?: { code: string; message: string } };
}

async function call(who: string, method: string, path: string, json?: unknown): Promise<Reply> {
  const headers: Record<string, string> = { authorization: `Bearer ${tok[who] ?? ""}` };
  if (json !== undefined) headers["content-type"] = "application/json";
  const res = await app.request(path, {
    method,
    headers,
    body: json === undefined ? undefined : JSON.stringify(json),
  });
  const text = await res.text();
  const body = (
    res.headers.get("content-type")?.includes("json") && text ? JSON.parse(text) : {}
  ) as Reply["body"];
  (await contractValidator()).check(method, path, res.status, body);
  return { status: res.status, body };
}

/** A creation that stops at its template once its tag is resolved (no VM is started). */
const create = (who: string, tag: string) =>
  call(who, "POST", "/v1/snapshots", { tag, template: "no-such-template" });
const resolved = (r: Reply) => r.status === 400 && /unknown template/.test(r.body.error?.message ?? "");
const tags = async (who: string) =>
  ((await call(who, "GET", "/v1/snapshots")).body.snapshots as { tag: string; owner?: string | null }[])
    .map((m) => `${m.tag}:${m.owner ?? "-"}`)
    .sort();

test("two tenants hold one tag, each its own; an admin names both; another's is never in the way", async () => {
  await fakeSnapshot(t.services.store, "alice/app", "alice");
  await fakeSnapshot(t.services.store, "bob/app", "bob");
  const a = await call("alice", "GET", "/v1/snapshots/app");
  const b = await call("bob", "GET", "/v1/snapshots/app");
  assert.deepEqual([a.status, a.body.tag, a.body.owner], [200, "app", "alice"]);
  assert.deepEqual([b.status, b.body.tag, b.body.owner], [200, "app", "bob"]);
  assert.notEqual(a.body.checksum, b.body.checksum, "two snapshots");
  assert.equal((await call("alice", "GET", "/v1/snapshots/app/info")).body.tag, "app");
  assert.deepEqual(await tags("alice"), ["app:alice", "python:-"]);
  assert.deepEqual(await tags("bob"), ["app:bob", "python:-"]);
  assert.deepEqual(await tags("carol"), ["python:-"]);
  assert.deepEqual(await tags("admin"), ["alice/app:alice", "bob/app:bob", "python:-"]);
  const byAdmin = await call("admin", "GET", "/v1/snapshots/alice%2Fapp");
  assert.deepEqual([byAdmin.body.tag, byAdmin.body.owner], ["alice/app", "alice"]);
  assert.equal((await call("admin", "GET", "/v1/snapshots/app")).status, 404, "the admins' own namespace");
  // Its own namespace, named with it, is the same; another tenant's does not exist for it.
  assert.equal((await call("alice", "GET", "/v1/snapshots/alice%2Fapp")).body.owner, "alice");
  const foreign = await call("alice", "GET", "/v1/snapshots/bob%2Fapp");
  assert.deepEqual([foreign.status, foreign.body.error?.message], [404, "no snapshot tagged bob/app"]);

  // Creating a tag others hold: resolved into its own namespace (no conflict); its own: 409.
  assert.ok(resolved(await create("carol", "app")), "carol's app meets nobody's");
  const again = await create("bob", "app");
  assert.deepEqual([again.status, again.body.error?.code], [409, "conflict"]);
  const shared = await create("alice", "python");
  assert.deepEqual([shared.status, shared.body.error?.code], [409, "conflict"]);
  assert.match(shared.body.error?.message ?? "", /shared/);
  assert.equal((await create("alice", "bob/other")).status, 400, "not into another's namespace");

  // Deleting its own leaves the other tenant's.
  assert.equal((await call("bob", "DELETE", "/v1/snapshots/app")).status, 200);
  assert.equal(await t.services.store.has("bob/app"), false);
  assert.equal(await t.services.store.has("alice/app"), true);
});

test("a reserved tag: a tenant cannot create, delete or take it, one answer whether or not it exists; it reads the shared one", async () => {
  const attempts = async () => {
    const out: Array<[number, unknown]> = [];
    for (const [method, path, body] of [
      ["POST", "/v1/snapshots", { tag: "code-interpreter-v1", template: "no-such-template" }],
      ["POST", "/v1/snapshots", { tag: "alice/code-interpreter-v1", template: "no-such-template" }],
      ["POST", "/v1/snapshots", { tag: "base", template: "no-such-template" }],
      ["DELETE", "/v1/snapshots/code-interpreter-v1", undefined],
      ["DELETE", "/v1/snapshots/base?dry_run=1", undefined],
      ["POST", "/v1/snapshots/app/compact", { tag: "code-interpreter-v1" }],
    ] as const) {
      const r = await call("alice", method, path, body);
      out.push([r.status, r.body.error]);
    }
    const build = await app.request("/v1/snapshots/build?tag=code-interpreter-v1", {
      method: "POST",
      headers: { authorization: `Bearer ${tok.alice}`, "content-type": "application/x-tar" },
      body: new Uint8Array(1024),
    });
    out.push([build.status, ((await build.json()) as { error?: unknown }).error]);
    return out;
  };
  const before = await attempts();
  for (const [status, error] of before) {
    assert.equal(status, 403, JSON.stringify(error));
    assert.match(JSON.stringify(error), /reserved/);
  }
  // The admins publish E2B's default: the same answers to the tenant.
  await fakeSnapshot(t.services.store, "code-interpreter-v1", null);
  await fakeSnapshot(t.services.store, "base", null);
  assert.deepEqual(await attempts(), before);
  const read = await call("alice", "GET", "/v1/snapshots/code-interpreter-v1");
  assert.deepEqual([read.status, read.body.tag, read.body.owner], [200, "code-interpreter-v1", null]);
  assert.equal(await t.services.store.has("code-interpreter-v1"), true, "not deleted");
  // An admin may, in the admins' namespace only.
  assert.ok(
    resolved(await call("admin", "POST", "/v1/snapshots", { tag: "desktop", template: "no-such-template" })),
  );
  assert.equal((await create("admin", "alice/desktop")).status, 403);
});

test("nothing a tenant is answered depends on another tenant's tags", async () => {
  const names = ["x", "y", "z", "w"];
  const probe = async () => {
    const out: Record<string, unknown> = {};
    const ask = async (label: string, method: string, path: string, body?: unknown) => {
      const r = await call("alice", method, path, body);
      out[label] = [r.status, r.body];
    };
    await ask("list", "GET", "/v1/snapshots");
    for (const n of names) {
      await ask(`get ${n}`, "GET", `/v1/snapshots/${n}`);
      await ask(`info ${n}`, "GET", `/v1/snapshots/${n}/info`);
      await ask(`delete ${n}`, "DELETE", `/v1/snapshots/${n}`);
      await ask(`create ${n}`, "POST", "/v1/snapshots", { tag: n, template: "no-such-template" });
      await ask(`fork ${n}`, "POST", "/v1/sandboxes", { snapshot_tag: n });
      await ask(`compact ${n}`, "POST", `/v1/snapshots/${n}/compact`, { tag: `${n}2` });
      await ask(`compact to ${n}`, "POST", "/v1/snapshots/python/compact", { tag: n });
      await ask(`qualified ${n}`, "GET", `/v1/snapshots/bob%2F${n}`);
      const pack = await app.request(`/v1/snapshots/${n}/pack`, {
        headers: { authorization: `Bearer ${tok.alice}` },
      });
      out[`pack ${n}`] = [pack.status, await pack.text()];
    }
    return out;
  };
  const nothing = await probe();
  assert.ok(
    names.every((n) =>
      resolved({ status: 400, body: (nothing[`create ${n}`] as [number, Reply["body"]])[1] }),
    ),
  );
  // Another tenant's snapshots as a data directory from before namespaces has them (plain
  // tags), an admin's private one (E2B), then in bob's namespace, and a failed one of bob's.
  await fakeSnapshot(t.services.store, "x", "bob");
  await fakeSnapshot(t.services.store, "z", "@admin");
  assert.deepEqual(await probe(), nothing);
  await fakeSnapshot(t.services.store, "bob/y", "bob");
  await fakeSnapshot(t.services.store, "bob/x", "bob");
  await t.services.store.recordFailed(
    { tag: "bob/w", started: new Date().toISOString(), source: null, owner: "bob" },
    new Error("boom"),
  );
  assert.deepEqual(await probe(), nothing);
});
