/**
 * The tokens file and bearer checks: only sha256 is stored (mode 0600), tokens are found by
 * hash and compared in constant time, a file others may write is refused, a bad file keeps the
 * tokens in force, weak FORKD_TOKEN values are named, and a daemon config that would expose TCP
 * without a token (or with a weak one) is refused.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { chmod, mkdtemp, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ANONYMOUS } from "../../src/access/caller.js";
import { OpenStreams, revokedError } from "../../src/access/open-streams.js";
import {
  Authenticator,
  TokenStore,
  bearerOf,
  secretEquals,
  weakTokenReason,
} from "../../src/access/tokens.js";
import { isLoopback, readAccessConfig } from "../../src/daemon/config.js";

const ADMIN = "Zq7-Xv2_Lm9pRt4wYb8nKc3dHf6jGs1e";

async function tmp(): Promise<{ dir: string; done: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-tokens-"));
  return { dir, done: () => rm(dir, { recursive: true, force: true }) };
}

test("tokens: created once, stored as sha256 only (0600), found again after a reload, revoked", async () => {
  const { dir, done } = await tmp();
  try {
    const path = join(dir, "tokens.json");
    const store = new TokenStore(path);
    await store.load(); // missing file: no tokens
    assert.equal(store.size, 0);
    const a = await store.create({ tenant: "alice", scope: "tenant", maxSandboxes: 3 });
    const b = await store.create({ tenant: "ops", scope: "admin" });
    assert.match(a.token, /^fkd_[A-Za-z0-9_-]{43}$/);
    assert.equal(weakTokenReason(a.token), null);
    assert.match(a.entry.id, /^tok-[a-z2-7]{12}$/);
    const raw = await readFile(path, "utf8");
    assert.ok(!raw.includes(a.token) && !raw.includes(b.token), "no secret on disk");
    assert.ok(raw.includes(createHash("sha256").update(a.token).digest("hex")));
    assert.equal((await stat(path)).mode & 0o777, 0o600);

    const again = new TokenStore(path);
    await again.load();
    const auth = new Authenticator(again, ADMIN);
    assert.deepEqual(auth.authenticate(`Bearer ${a.token}`), {
      name: "alice",
      tenant: "alice",
      tokenId: a.entry.id,
      limited: true,
      maxSandboxes: 3,
      credential: `token:${a.entry.id}`,
    });
    assert.equal(auth.authenticate(`Bearer ${b.token}`)?.tenant, null, "admin scope sees every tenant");
    assert.equal(auth.authenticate(`Bearer ${ADMIN}`)?.name, "admin");
    for (const bad of [
      undefined,
      "",
      `Bearer ${a.token}x`,
      `Bearer ${a.token.slice(0, -1)}`,
      a.token,
      `Token ${a.token}`,
    ])
      assert.equal(auth.authenticate(bad), null, String(bad));

    await again.revoke(a.entry.id);
    assert.equal(auth.authenticate(`Bearer ${a.token}`), null);
    await assert.rejects(again.revoke(a.entry.id), /no token/);
    assert.deepEqual(
      again.list().map((t) => t.tenant),
      ["ops"],
    );
    assert.ok(again.list().every((t) => !("sha256" in t)));
  } finally {
    await done();
  }
});

test("tokens file: writable by others, a symlink, or invalid is refused; the tokens in force stay", async () => {
  const { dir, done } = await tmp();
  try {
    const path = join(dir, "tokens.json");
    const store = new TokenStore(path);
    const { token } = await store.create({ tenant: "alice", scope: "tenant" });
    await chmod(path, 0o666);
    await assert.rejects(store.load(), /writable by others/);
    await chmod(path, 0o644); // readable is fine: it holds hashes only
    await store.load();
    await symlink(path, join(dir, "link.json"));
    await assert.rejects(new TokenStore(join(dir, "link.json")).load(), /not a regular file/);
    await writeFile(path, JSON.stringify({ format: 1, tokens: [{ id: "tok-x", tenant: "A" }] }), {
      mode: 0o600,
    });
    await chmod(path, 0o600);
    await assert.rejects(store.load(), /is invalid/);
    assert.ok(store.find(token), "a bad file does not drop the tokens already loaded");
  } finally {
    await done();
  }
});

test("open streams: ended once with the reason when their credential is revoked, others kept; an end by itself unregisters", () => {
  const opened = new OpenStreams();
  const ended: string[] = [];
  const a1 = opened.open("token:tok-aaaaaaaaaaaa", (why) => ended.push(`a1 ${why.code} ${why.message}`));
  opened.open("token:tok-aaaaaaaaaaaa", () => {
    throw new Error("a broken socket");
  });
  opened.open("token:tok-aaaaaaaaaaaa", () => ended.push("a3"));
  opened.open("token:tok-bbbbbbbbbbbb", () => ended.push("b"));
  opened.open(undefined, () => ended.push("never")); // no credential: nothing is kept
  assert.equal(opened.count("token:tok-aaaaaaaaaaaa"), 3);
  a1();
  a1();
  assert.equal(opened.count("token:tok-aaaaaaaaaaaa"), 2);
  const second = opened.open("token:tok-aaaaaaaaaaaa", (why) =>
    ended.push(`a4 ${String(why.details.reason)}`),
  );
  assert.equal(opened.revoke("token:tok-aaaaaaaaaaaa"), 3, "one failing to end spares none of the others");
  assert.deepEqual(ended, ["a3", "a4 token_revoked"]);
  second(); // its own end after the revocation: nothing more
  assert.equal(opened.revoke("token:tok-aaaaaaaaaaaa"), 0);
  assert.equal(opened.count("token:tok-bbbbbbbbbbbb"), 1);
  assert.match(revokedError("token:tok-aaaaaaaaaaaa").message, /tok-aaaaaaaaaaaa\) was revoked/);
});

test("tokens: a revoke, or a reload without the token (or with it changed), ends what it opened", async () => {
  const { dir, done } = await tmp();
  try {
    const path = join(dir, "tokens.json");
    const store = new TokenStore(path);
    const a = await store.create({ tenant: "alice", scope: "tenant" });
    const b = await store.create({ tenant: "bob", scope: "tenant" });
    const c = await store.create({ tenant: "carol", scope: "tenant" });
    const auth = new Authenticator(store);
    const ended: string[] = [];
    const open = (token: string, name: string) =>
      store.opened.open(auth.authenticate(`Bearer ${token}`)?.credential, (why) =>
        ended.push(`${name}: ${why.code}`),
      );
    open(a.token, "a");
    open(b.token, "b");
    open(c.token, "c");
    await store.revoke(a.entry.id);
    assert.deepEqual(ended, ["a: unauthenticated"]);
    // The file edited by hand and reloaded (SIGHUP): b gone, c's tenant changed.
    const file = JSON.parse(await readFile(path, "utf8")) as { tokens: { id: string; tenant: string }[] };
    file.tokens = file.tokens.filter((t) => t.id !== b.entry.id);
    for (const t of file.tokens) t.tenant = "mallory";
    await writeFile(path, JSON.stringify(file), { mode: 0o600 });
    await store.load();
    assert.deepEqual(ended, ["a: unauthenticated", "b: unauthenticated", "c: unauthenticated"]);
    assert.equal(auth.authenticate(`Bearer ${c.token}`)?.tenant, "mallory");
    assert.deepEqual(auth.credentialsSeeing("mallory"), [`token:${c.entry.id}`]);
  } finally {
    await done();
  }
});

test("bearer parsing, constant-time compare and weak-token reasons", () => {
  assert.equal(bearerOf("Bearer abc"), "abc");
  assert.equal(bearerOf("bearer  abc "), "abc");
  assert.equal(bearerOf("Bearer a b"), null);
  assert.equal(bearerOf("Basic abc"), null);
  assert.equal(bearerOf(`Bearer ${"x".repeat(513)}`), null);
  assert.equal(secretEquals(ADMIN, ADMIN), true);
  assert.equal(secretEquals(ADMIN, ADMIN + "x"), false); // lengths differ: digests do not
  assert.equal(secretEquals("", ADMIN), false);
  assert.equal(weakTokenReason(ADMIN), null);
  assert.match(weakTokenReason("short") ?? "", /shorter/);
  assert.match(weakTokenReason("x".repeat(40)) ?? "", /distinct/);
  assert.match(weakTokenReason("changeme-changeme-changeme-0123456789") ?? "", /placeholder/);
  assert.match(weakTokenReason("my secret token with spaces 0123456789") ?? "", /spaces/);
  assert.ok(ANONYMOUS.tenant !== null, "the anonymous caller is never an admin");
});

test("daemon config: TCP with a weak token, TLS halves or bad numbers refused; loopback known", async () => {
  const data = "/nonexistent";
  await assert.rejects(
    readAccessConfig({ FORKD_LISTEN: "0.0.0.0:1", FORKD_TOKEN: "changeme" }, data),
    /FORKD_TOKEN/,
  );
  await assert.rejects(readAccessConfig({ FORKD_LISTEN: "nohost" }, data), /HOST:PORT/);
  await assert.rejects(
    readAccessConfig({ FORKD_LISTEN: "127.0.0.1:1", FORKD_TLS_CERT: "/x" }, data),
    /go together/,
  );
  await assert.rejects(
    readAccessConfig({ FORKD_TLS_CERT: "/x", FORKD_TLS_KEY: "/y" }, data),
    /need FORKD_LISTEN/,
  );
  await assert.rejects(readAccessConfig({ FORKD_RATE_RPS: "-1" }, data), /FORKD_RATE_RPS/);
  await assert.rejects(readAccessConfig({ FORKD_MAX_JSON_BYTES: "1e3x" }, data), /FORKD_MAX_JSON_BYTES/);
  const c = await readAccessConfig(
    { FORKD_LISTEN: "[::1]:8889", FORKD_TOKEN: ADMIN, FORKD_MAX_JSON_BYTES: "2048" },
    data,
  );
  assert.deepEqual([c.tcp?.host, c.tcp?.port, c.tcp?.loopback, c.tcp?.tls], ["::1", 8889, true, null]);
  assert.equal(c.body.json, 2048);
  assert.equal(c.tokensFile, "/nonexistent/tokens.json");
  for (const h of ["127.0.0.1", "127.1.2.3", "::1", "localhost"]) assert.equal(isLoopback(h), true, h);
  for (const h of ["0.0.0.0", "10.0.0.1", "::", "example.com"]) assert.equal(isLoopback(h), false, h);
});
