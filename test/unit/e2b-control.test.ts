/**
 * E2B's control plane without VMs: FORKD_E2B_LISTEN and FORKD_E2B_DOMAIN parsing, the `e2b_` +
 * hex API keys (stored as sha256, scoped like every token), the envd access tokens (HMAC of the
 * sandbox id under the data directory's secret: stable across a reopen, its file 0600), the
 * sandbox plane's authorization rules, E2B's network settings onto forkd's egress, the list's
 * metadata query, the metrics parser, and the reaping of fork snapshots.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { chmod, mkdtemp, readFile, rm, stat } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AuthFailureLimiter } from "../../src/access/auth-failures.js";
import { Authenticator, E2B_KEY_RE, TokenStore, credentialOf } from "../../src/access/tokens.js";
import type { E2bServices as Services } from "../../src/e2b/context.js";
import { readAccessConfig } from "../../src/daemon/config.js";
import { AccessTokens } from "../../src/e2b/access-token.js";
import { authorizeSandbox } from "../../src/e2b/auth.js";
import { reapForkSnapshots } from "../../src/app/fork-snapshots.js";
import { parseMetadataQuery } from "../../src/e2b/control/list.js";
import { parseMetrics } from "../../src/e2b/control/metrics.js";
import { networkOf } from "../../src/e2b/control/network.js";
import type { ReadonlySandbox } from "../../src/sandbox/sandbox.js";
import { ForkdError } from "../../src/util/errors.js";

async function tmp(): Promise<{ dir: string; done: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-e2b-unit-"));
  return { dir, done: () => rm(dir, { recursive: true, force: true }) };
}

test("config: FORKD_E2B_LISTEN is HOST:PORT (loopback known), FORKD_E2B_DOMAIN a DNS name that needs it", async () => {
  const data = "/nonexistent";
  const c = await readAccessConfig(
    { FORKD_E2B_LISTEN: "127.0.0.1:49982", FORKD_E2B_DOMAIN: "Sandbox.Example.com" },
    data,
  );
  assert.equal(c.tcp, null);
  assert.deepEqual(
    [c.e2b?.host, c.e2b?.port, c.e2b?.loopback, c.e2b?.tls, c.e2b?.domain],
    ["127.0.0.1", 49982, true, null, "sandbox.example.com"],
  );
  const v6 = await readAccessConfig({ FORKD_E2B_LISTEN: "[::]:3000" }, data);
  assert.deepEqual([v6.e2b?.host, v6.e2b?.loopback, v6.e2b?.domain], ["::", false, null]);
  await assert.rejects(
    readAccessConfig({ FORKD_E2B_LISTEN: "3000" }, data),
    /FORKD_E2B_LISTEN must be HOST:PORT/,
  );
  await assert.rejects(readAccessConfig({ FORKD_E2B_LISTEN: "h:70000" }, data), /FORKD_E2B_LISTEN/);
  await assert.rejects(readAccessConfig({ FORKD_E2B_DOMAIN: "e2b.example" }, data), /needs FORKD_E2B_LISTEN/);
  await assert.rejects(
    readAccessConfig({ FORKD_E2B_LISTEN: "127.0.0.1:1", FORKD_E2B_DOMAIN: "bad domain" }, data),
    /DNS name/,
  );
  await assert.rejects(
    readAccessConfig({ FORKD_E2B_LISTEN: "127.0.0.1:5", FORKD_LISTEN: "127.0.0.1:5" }, data),
    /must differ/,
  );
  // TLS is the listeners' one setting: it needs one of them, and both halves.
  await assert.rejects(
    readAccessConfig({ FORKD_TLS_CERT: "/x", FORKD_TLS_KEY: "/y" }, data),
    /FORKD_E2B_LISTEN/,
  );
  await assert.rejects(
    readAccessConfig({ FORKD_E2B_LISTEN: "127.0.0.1:1", FORKD_TLS_KEY: "/y" }, data),
    /go together/,
  );
  await assert.rejects(
    readAccessConfig(
      { FORKD_E2B_LISTEN: "127.0.0.1:1", FORKD_TLS_CERT: "/no/x", FORKD_TLS_KEY: "/no/y" },
      data,
    ),
    /cannot read FORKD_TLS_CERT/,
  );
});

test("keys: --e2b makes e2b_ + 64 hex digits, stored as sha256 only, scoped to its tenant", async () => {
  const { dir, done } = await tmp();
  try {
    const store = new TokenStore(join(dir, "tokens.json"));
    await store.load();
    const k = await store.create({ tenant: "alice", scope: "tenant", e2b: true });
    assert.match(k.token, /^e2b_[0-9a-f]{64}$/);
    assert.match(k.token, E2B_KEY_RE);
    assert.equal(k.entry.kind, "e2b");
    const file = await readFile(join(dir, "tokens.json"), "utf8");
    assert.ok(!file.includes(k.token.slice(4)), "the key itself is never stored");
    const plain = await store.create({ tenant: "bob", scope: "tenant" });
    assert.equal(plain.entry.kind, undefined);
    const again = new TokenStore(join(dir, "tokens.json"));
    await again.load();
    const caller = new Authenticator(again).authenticate(`Bearer ${k.token}`);
    assert.equal(caller?.tenant, "alice");
    assert.equal(caller?.tokenId, k.entry.id);
    assert.equal(new Authenticator(again).authenticate(`Bearer e2b_${"0".repeat(64)}`), null);
  } finally {
    await done();
  }
});

test("access tokens: bound to a key, HMAC of the id and the key's credential, stable across a reopen of the 0600 secret", async () => {
  const { dir, done } = await tmp();
  try {
    const t1 = await AccessTokens.open(dir);
    const st = await stat(join(dir, "e2b-secret"));
    assert.equal(st.mode & 0o777, 0o600);
    const key = "token:tok-abcdefghijkl";
    const a = t1.of("sb-aaaaaaaaaaaaaaaa", key) ?? "";
    assert.match(a, /^tok-abcdefghijkl\.[0-9a-f]{64}$/);
    assert.notEqual(a, t1.of("sb-bbbbbbbbbbbbbbbb", key), "each sandbox its own");
    const other = t1.of("sb-aaaaaaaaaaaaaaaa", "token:tok-bbbbbbbbbbbb") ?? "";
    assert.notEqual(other, a, "each key its own");
    assert.match(t1.of("sb-aaaaaaaaaaaaaaaa", "env-admin") ?? "", /^admin\.[0-9a-f]{64}$/);
    assert.equal(t1.of("sb-aaaaaaaaaaaaaaaa", undefined), null, "no credential, no token");
    const t2 = await AccessTokens.open(dir);
    assert.equal(t2.of("sb-aaaaaaaaaaaaaaaa", key), a, "the same after a restart");
    assert.equal(t2.issuedTo("sb-aaaaaaaaaaaaaaaa", a), key);
    assert.equal(t2.issuedTo("sb-aaaaaaaaaaaaaaaa", other), "token:tok-bbbbbbbbbbbb");
    assert.equal(t2.issuedTo("sb-bbbbbbbbbbbbbbbb", a), null);
    assert.equal(t2.issuedTo("sb-aaaaaaaaaaaaaaaa", a.slice(0, -1)), null);
    // Another key's id on this key's MAC does not pass for it.
    assert.equal(t2.issuedTo("sb-aaaaaaaaaaaaaaaa", a.replace("tok-abcdefghijkl", "tok-bbbbbbbbbbbb")), null);
    assert.equal(t2.issuedTo("sb-aaaaaaaaaaaaaaaa", ""), null);
    const elsewhere = AccessTokens.fromSecret(Buffer.alloc(32, 7));
    assert.notEqual(elsewhere.of("sb-aaaaaaaaaaaaaaaa", key), a, "another daemon's secret, another token");
    await chmod(join(dir, "e2b-secret"), 0o644);
    await assert.rejects(AccessTokens.open(dir), /chmod 600/);
  } finally {
    await done();
  }
});

function fakeServices(sandboxes: ReadonlySandbox[], auth: Authenticator, tokens: AccessTokens): Services {
  return {
    sandboxes: { list: () => sandboxes },
    limits: { authFailures: new AuthFailureLimiter({ rps: 0, burst: 100 }) },
    e2b: { auth, accessTokens: tokens, domain: null },
  } as unknown as Services;
}

const sandbox = (
  id: string,
  owner: string | null,
  secure: boolean | undefined,
  state = "running",
): ReadonlySandbox =>
  ({
    record: { id, owner, ...(secure === undefined ? {} : { e2b: { secure } }) },
    state,
  }) as unknown as ReadonlySandbox;

const request = (headers: Record<string, string>): IncomingMessage =>
  ({ headers, socket: { remoteAddress: "127.0.0.9" } }) as unknown as IncomingMessage;

test("authorizeSandbox: secure needs its access token; keys of its tenant; others' sandboxes not found", async () => {
  const { dir, done } = await tmp();
  try {
    const store = new TokenStore(join(dir, "tokens.json"));
    await store.load();
    const aliceKey = await store.create({ tenant: "alice", scope: "tenant", e2b: true });
    const alice = aliceKey.token;
    const bob = (await store.create({ tenant: "bob", scope: "tenant", e2b: true })).token;
    const root = await store.create({ tenant: "ops", scope: "admin", e2b: true });
    const aliceTwo = await store.create({ tenant: "alice", scope: "tenant", e2b: true });
    const keys = AccessTokens.fromSecret(Buffer.alloc(32, 1));
    const tokens = { of: (id: string) => keys.of(id, credentialOf(aliceKey.entry.id)) ?? "" };
    const sec = sandbox("sb-aaaaaaaaaaaaaaaa", "alice", true);
    const open = sandbox("sb-bbbbbbbbbbbbbbbb", "alice", false);
    const rest = sandbox("sb-cccccccccccccccc", "alice", undefined);
    const gone = sandbox("sb-dddddddddddddddd", "alice", true, "exited");
    const s = fakeServices([sec, open, rest, gone], new Authenticator(store), keys);
    const code = (f: () => unknown): string => {
      try {
        f();
        return "ok";
      } catch (e) {
        assert.ok(e instanceof ForkdError);
        return e.code;
      }
    };
    const at = (sb: ReadonlySandbox, headers: Record<string, string>) =>
      code(() => authorizeSandbox(s, request(headers), { sandboxId: sb.record.id, port: 49983 }));
    assert.equal(at(sec, { "x-access-token": tokens.of(sec.record.id) }), "ok");
    assert.equal(
      authorizeSandbox(s, request({ "x-access-token": tokens.of(sec.record.id) }), {
        sandboxId: sec.record.id,
        port: 49983,
      }).caller.tenant,
      "alice",
    );
    // Every refusal is a missing sandbox's answer (the plane tells nothing of which ids exist).
    assert.equal(at(sec, { "x-access-token": tokens.of(open.record.id) }), "not_found", "another's token");
    assert.equal(at(sec, { "x-api-key": alice }), "not_found", "secure: a key is not enough");
    assert.equal(at(sec, {}), "not_found");
    assert.equal(at(sec, { "x-api-key": bob }), "not_found", "another tenant's");
    assert.equal(at(rest, { "x-api-key": alice }), "ok");
    assert.equal(at(rest, { authorization: `Bearer ${alice}` }), "ok");
    assert.equal(at(rest, { "x-api-key": bob }), "not_found");
    assert.equal(at(rest, {}), "not_found");
    assert.equal(at(open, {}), "ok", "secure: false answers without a credential");
    assert.equal(at(open, { "x-api-key": "e2b_00" }), "not_found");
    assert.equal(at(gone, { "x-access-token": tokens.of(gone.record.id) }), "not_found");
    assert.equal(
      code(() => authorizeSandbox(s, request({}), { sandboxId: "../etc", port: 49983 })),
      "not_found",
    );
    // Each key's token opens it (an admin key's too), and stands for that key's credential.
    const two = keys.of(sec.record.id, credentialOf(aliceTwo.entry.id)) ?? "";
    const ops = keys.of(sec.record.id, credentialOf(root.entry.id)) ?? "";
    assert.equal(at(sec, { "x-access-token": ops }), "ok");
    assert.equal(
      authorizeSandbox(s, request({ "x-access-token": two }), { sandboxId: sec.record.id, port: 49983 })
        .caller.credential,
      credentialOf(aliceTwo.entry.id),
    );
    // Revoking the key revokes the access tokens it was given (401: it was a valid token), and
    // only those.
    await store.revoke(aliceKey.entry.id);
    assert.equal(at(sec, { "x-access-token": tokens.of(sec.record.id) }), "unauthenticated");
    assert.equal(at(sec, { "x-access-token": two }), "ok", "another key's token goes on working");
    await store.revoke(root.entry.id);
    assert.equal(at(sec, { "x-access-token": ops }), "unauthenticated");
  } finally {
    await done();
  }
});

test("network: internet by default in the host's mode; deny-all with allowOut is a list; the rest refused", () => {
  const both = { netns: true, user: true };
  assert.equal(networkOf(both, undefined, undefined).mode, "netns");
  assert.equal(networkOf(both, undefined, undefined).egress.mode, "allow");
  assert.equal(networkOf({ netns: false, user: true }, true, undefined).mode, "user");
  assert.equal(networkOf({ netns: false, user: false }, true, undefined).mode, "none");
  assert.equal(networkOf(both, false, undefined).mode, "none");
  const list = networkOf(both, false, { allowOut: ["8.8.8.8", "10.1.0.0/16"] });
  assert.equal(list.egress.mode, "list");
  assert.deepEqual(
    list.egress.allow.map((r) => r.cidr),
    ["8.8.8.8/32", "10.1.0.0/16"],
  );
  assert.equal(
    networkOf(both, undefined, { denyOut: ["0.0.0.0/0"], allowOut: ["1.1.1.1"] }).egress.mode,
    "list",
  );
  assert.equal(networkOf(both, undefined, { allowOut: ["1.1.1.1"] }).egress.mode, "allow", "nothing denied");
  assert.throws(() => networkOf(both, false, { allowOut: ["example.com"] }), /domain names/);
  assert.throws(() => networkOf(both, undefined, { denyOut: ["10.0.0.0/8"] }), /only 0.0.0.0\/0/);
  assert.throws(() => networkOf(both, undefined, { rules: { "a.com": [] } }), /rules/);
  assert.throws(() => networkOf(both, false, { allowOut: ["10.1.2.3/8"] }), /host bits/);
});

test("list: the metadata query is URL-encoded pairs (keys and values encoded once more by the SDK)", () => {
  const q = new URLSearchParams({
    [encodeURIComponent("a b")]: encodeURIComponent("x&y=z"),
    k: "v",
  }).toString();
  assert.deepEqual(parseMetadataQuery(q), [
    ["a b", "x&y=z"],
    ["k", "v"],
  ]);
  assert.deepEqual(parseMetadataQuery(""), []);
});

test("metrics: CPU over the interval, memory without caches, the root file system", () => {
  const out = [
    "cpu  100 0 100 800 0 0 0 0 0 0",
    "cpu  150 0 150 900 0 0 0 0 0 0",
    "2",
    "MemTotal:        1000 kB",
    "MemFree:          300 kB",
    "Buffers:           50 kB",
    "Cached:           150 kB",
    "/dev/vda           2000      500      1500  25% /",
    "",
  ].join("\n");
  const m = parseMetrics(out, new Date(1_700_000_000_000));
  assert.equal(m.cpuCount, 2);
  assert.equal(m.cpuUsedPct, 50);
  assert.equal(m.memTotal, 1000 * 1024);
  assert.equal(m.memCache, 200 * 1024);
  assert.equal(m.memUsed, 500 * 1024);
  assert.equal(m.diskTotal, 2000 * 1024);
  assert.equal(m.diskUsed, 500 * 1024);
  assert.equal(m.timestampUnix, 1_700_000_000);
});

test("fork snapshots: deleted once no sandbox runs from them and past the grace; others left", async () => {
  const now = Date.parse("2026-12-01T12:00:00Z");
  const old = new Date(now - 11 * 60_000).toISOString();
  const fresh = new Date(now - 60_000).toISOString();
  const metas = [
    { tag: "e2b-fork-aaaa", created: old },
    { tag: "e2b-fork-bbbb", created: old },
    { tag: "e2b-fork-cccc", created: fresh },
    { tag: "e2b-fork-dddd", created: old },
    { tag: "snap-eeee", created: old },
  ];
  const deleted: string[] = [];
  const s = {
    store: { list: async () => metas },
    sandboxes: { countByTag: (t: string) => (t === "e2b-fork-bbbb" ? 1 : 0) },
    snapshots: {
      delete: async (t: string) => {
        if (t === "e2b-fork-dddd") throw new ForkdError("conflict", "a branch is stacked on it");
        deleted.push(t);
        return {};
      },
    },
    log: { info: () => undefined, warn: () => undefined },
  } as unknown as Services;
  assert.deepEqual(await reapForkSnapshots(s, now), ["e2b-fork-aaaa"]);
  assert.deepEqual(deleted, ["e2b-fork-aaaa"]);
});
