/**
 * Registry authentication without a real registry: the WWW-Authenticate parser, credentials
 * lookup, and the client against small fake registries on loopback (Bearer token service,
 * Basic), including where credentials must not go.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buffer } from "node:stream/consumers";
import { createHash } from "node:crypto";
import { parseChallenges } from "../../src/registry/challenge.js";
import { RegistryClient } from "../../src/registry/client.js";
import { credentialsFromEnv } from "../../src/registry/credentials.js";
import type { Credentials } from "../../src/registry/credentials.js";
import { parseRef } from "../../src/registry/ref.js";
import { checkScheme } from "../../src/registry/transport.js";
import { ForkdError } from "../../src/util/errors.js";

test("WWW-Authenticate: Bearer and Basic challenges, quoted commas, escapes, several in one header", () => {
  assert.deepEqual(
    parseChallenges(
      'Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push"',
    ),
    [
      {
        scheme: "bearer",
        params: {
          realm: "https://auth.example.com/token",
          service: "registry.example.com",
          scope: "repository:a/b:pull,push",
        },
      },
    ],
  );
  assert.deepEqual(parseChallenges('Basic realm="Registry Realm"'), [
    { scheme: "basic", params: { realm: "Registry Realm" } },
  ]);
  assert.deepEqual(parseChallenges('Basic realm="a", Bearer realm="https://t/x", error=invalid_token'), [
    { scheme: "basic", params: { realm: "a" } },
    { scheme: "bearer", params: { realm: "https://t/x", error: "invalid_token" } },
  ]);
  assert.deepEqual(parseChallenges('BEARER Realm = "q\\"uote" ,  Service=svc'), [
    { scheme: "bearer", params: { realm: 'q"uote', service: "svc" } },
  ]);
  // The first of a repeated parameter counts; junk yields nothing rather than a throw.
  assert.deepEqual(parseChallenges('Bearer realm="1",realm="2"'), [
    { scheme: "bearer", params: { realm: "1" } },
  ]);
  for (const junk of [null, "", "   ", ",,,", "=x", "x".repeat(10000)]) {
    assert.deepEqual(parseChallenges(junk), [], String(junk).slice(0, 20));
  }
});

test("credentials: environment (optionally per host), else the Docker config's auths", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-creds-"));
  try {
    await writeFile(
      join(dir, "config.json"),
      JSON.stringify({
        auths: {
          "https://index.docker.io/v1/": { auth: Buffer.from("hub:pa:ss").toString("base64") },
          "r.example.com:5000": { username: "u", password: "p" },
        },
        credsStore: "desktop",
      }),
    );
    const fromFile = credentialsFromEnv({ DOCKER_CONFIG: dir });
    assert.deepEqual(await fromFile("docker.io"), { username: "hub", password: "pa:ss" });
    assert.deepEqual(await fromFile("r.example.com:5000"), { username: "u", password: "p" });
    assert.equal(await fromFile("r.example.com"), null, "the port is part of the key");
    assert.equal(await fromFile("other.io"), null);
    const env = { DOCKER_CONFIG: dir, FORKD_REGISTRY_USER: "me", FORKD_REGISTRY_PASSWORD: "pw" };
    assert.deepEqual(await credentialsFromEnv(env)("other.io"), { username: "me", password: "pw" });
    const scoped = credentialsFromEnv({ ...env, FORKD_REGISTRY_HOSTS: "ghcr.io, other.io" });
    assert.deepEqual(await scoped("other.io"), { username: "me", password: "pw" });
    assert.deepEqual(
      await scoped("docker.io"),
      { username: "hub", password: "pa:ss" },
      "not listed: the file",
    );
    assert.equal(await credentialsFromEnv({ DOCKER_CONFIG: join(dir, "none") })("docker.io"), null);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("scheme policy: https anywhere, http only on loopback or when insecure", () => {
  checkScheme(new URL("https://r.example.com/v2/"), { insecure: false });
  checkScheme(new URL("http://127.0.0.1:5000/v2/"), { insecure: false });
  checkScheme(new URL("http://r.example.com/v2/"), { insecure: true });
  for (const u of ["http://r.example.com/v2/", "ftp://r.example.com/x", "file:///etc/passwd"]) {
    assert.throws(
      () => checkScheme(new URL(u), { insecure: false }),
      (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument",
      u,
    );
  }
});

type Handler = (req: IncomingMessage, res: ServerResponse, port: number) => void;

async function serve(h: Handler): Promise<{ port: number; server: Server }> {
  const server = createServer((req, res) => h(req, res, port));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as { port: number }).port;
  return { port, server };
}

const blob = Buffer.from("the blob");
const digest = `sha256:${createHash("sha256").update(blob).digest("hex")}`;
const basicOf = (c: Credentials) => `Basic ${Buffer.from(`${c.username}:${c.password}`).toString("base64")}`;
const client = (port: number, creds: Credentials | null, push = false, host = "127.0.0.1") =>
  new RegistryClient(parseRef(`${host}:${port}/team/snap:v1`), {
    insecure: false,
    credentials: () => Promise.resolve(creds),
    chunkBytes: 1 << 20,
    idleMs: 5_000,
    push,
  });

test("Bearer: the token service gets the credentials and the scope, the registry only the token", async () => {
  const creds = { username: "alice", password: "s3cret" };
  const seen: { path: string; auth: string | undefined }[] = [];
  const { port, server } = await serve((req, res, p) => {
    const url = new URL(req.url ?? "/", "http://x");
    seen.push({ path: url.pathname, auth: req.headers.authorization });
    if (url.pathname === "/token") {
      if (req.headers.authorization !== basicOf(creds)) {
        res.writeHead(401).end();
        return;
      }
      const scope = url.searchParams.getAll("scope").join(" ");
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ access_token: `tok:${url.searchParams.get("service")}:${scope}` }));
      return;
    }
    const want = "Bearer tok:fake:repository:team/snap:pull";
    if (req.headers.authorization !== want && req.headers.authorization !== `${want},push`) {
      res.writeHead(401, {
        "www-authenticate": `Bearer realm="http://127.0.0.1:${p}/token",service="fake",scope="repository:team/snap:pull"`,
      });
      res.end();
      return;
    }
    if (url.pathname === `/v2/team/snap/blobs/${digest}`) {
      res.writeHead(200, { "content-length": blob.length });
      res.end(req.method === "HEAD" ? undefined : blob);
      return;
    }
    res.writeHead(404).end();
  });
  try {
    const c = client(port, creds);
    assert.equal(await c.blobExists(digest), true);
    assert.deepEqual(await buffer(await c.openBlob(digest, blob.length)), blob);
    const tokenCalls = seen.filter((s) => s.path === "/token");
    assert.equal(tokenCalls.length, 1, "the token is reused");
    for (const s of seen.filter((x) => x.path !== "/token")) {
      assert.notEqual(s.auth, basicOf(creds), `${s.path}: the password never goes to the registry`);
    }
    // A push client asks for push too.
    seen.length = 0;
    assert.equal(await client(port, creds, true).blobExists(digest), true);
    assert.ok(seen.some((s) => s.auth === "Bearer tok:fake:repository:team/snap:pull,push"));
    // Wrong credentials: the token service refuses, and the error says so (without them).
    await assert.rejects(
      client(port, { username: "alice", password: "wrong" }).blobExists(digest),
      (e: unknown) =>
        e instanceof ForkdError &&
        e.code === "invalid_argument" &&
        /refused the credentials/.test(e.message) &&
        !e.message.includes("wrong"),
    );
  } finally {
    server.close();
  }
});

test("Basic: credentials only after the challenge; none means a clear 401 error", async () => {
  const creds = { username: "bob", password: "pw" };
  const auths: (string | undefined)[] = [];
  const { port, server } = await serve((req, res) => {
    auths.push(req.headers.authorization);
    if (req.headers.authorization !== basicOf(creds)) {
      res.writeHead(401, { "www-authenticate": 'Basic realm="fake"' }).end();
      return;
    }
    res.writeHead(req.url?.endsWith(digest) ? 200 : 404).end();
  });
  try {
    assert.equal(await client(port, creds).blobExists(digest), true);
    assert.equal(auths[0], undefined, "the first request is anonymous");
    await assert.rejects(
      client(port, null).blobExists(digest),
      (e: unknown) => e instanceof ForkdError && /answered 401/.test(e.message),
    );
  } finally {
    server.close();
  }
});

test("a blob redirected to another origin is fetched without our Authorization; a wrong blob fails", async () => {
  const storage: (string | undefined)[] = [];
  const store = await serve((req, res) => {
    storage.push(req.headers.authorization);
    res
      .writeHead(200, { "content-length": blob.length })
      .end(req.url === "/bad" ? Buffer.from("the blub") : blob);
  });
  const { port, server } = await serve((req, res) => {
    if (req.headers.authorization !== "Basic " + Buffer.from("u:p").toString("base64")) {
      res.writeHead(401, { "www-authenticate": 'Basic realm="x"' }).end();
      return;
    }
    const bad = req.url?.includes("0".repeat(32)) ?? false;
    if (req.url === "/v2/") res.writeHead(200).end();
    else res.writeHead(307, { location: `http://localhost:${store.port}/${bad ? "bad" : "ok"}` }).end();
  });
  try {
    const c = client(port, { username: "u", password: "p" });
    assert.deepEqual(await buffer(await c.openBlob(digest, blob.length)), blob);
    assert.deepEqual(storage, [undefined], "storage saw no credentials");
    const other = `sha256:${"0".repeat(63)}1`;
    await assert.rejects(
      buffer(await c.openBlob(other, blob.length)),
      (e: unknown) => e instanceof ForkdError && /does not match its digest/.test(e.message),
    );
  } finally {
    server.close();
    store.server.close();
  }
});
