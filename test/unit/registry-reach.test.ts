/**
 * What a tenant's registry request may reach (src/registry/reach.ts, src/util/ip.ts), no VM:
 *   - addresses: loopback, unspecified, link-local (169.254.169.254), private, unique-local,
 *     multicast and the host's own are not public, in both families and in the IPv6 forms that
 *     carry an IPv4 address; public ones are;
 *   - the transport against small HTTP servers on this host: a tenant's request to 127.0.0.1,
 *     localhost, [::1], a v4-mapped address, 0.0.0.0, the metadata address, a name that resolves
 *     to loopback and one of the host's own interface addresses is refused (403 forbidden) before
 *     anything connects, with the same answer whether a port is open or not; the operator's
 *     request reaches them; a registry the operator allows by name is reached; a redirect from it
 *     to loopback is refused, and so is a token realm on loopback; a name that resolved to a
 *     public address before and to loopback when the connection is made is refused (the check is
 *     the connection's);
 *   - the image puller against a real registry on loopback: the admin's pull works, a tenant's is
 *     refused, also by digest once the admin's pull cached it; the operator's list admits it;
 *   - the operator's registry credentials go to a host a tenant names only when listed by name.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { networkInterfaces } from "node:os";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { LookupAddress } from "node:dns";
import { ImagePuller } from "../../src/oci/puller.js";
import { RegistryClient } from "../../src/registry/client.js";
import type { RegistrySettings } from "../../src/registry/client.js";
import { credentialsFromEnv } from "../../src/registry/credentials.js";
import { parseRef } from "../../src/registry/ref.js";
import { assertReachable, hostAddresses, parseAllowedHosts, tenantGuard } from "../../src/registry/reach.js";
import type { TenantGuard } from "../../src/registry/reach.js";
import { readLimited, send } from "../../src/registry/transport.js";
import type { SchemePolicy } from "../../src/registry/transport.js";
import { ForkdError } from "../../src/util/errors.js";
import { ipBytes, ipKey, notPublic } from "../../src/util/ip.js";
import { busyboxTar, pushImage } from "../helpers/oci-images.js";
import { freePort } from "../helpers/port.js";
import { startRegistry } from "../helpers/registry.js";
import type { TestRegistry } from "../helpers/registry.js";

test("addresses: what is not public, in both families and in IPv6 forms carrying IPv4", () => {
  const why = (a: string, own: string[] = []) => {
    const b = ipBytes(a);
    assert.ok(b, `${a} parses`);
    return notPublic(b, new Set(own.map((o) => ipKey(ipBytes(o) ?? new Uint8Array(16)))));
  };
  const refused: Array<[string, string]> = [
    ["127.0.0.1", "loopback"],
    ["127.255.1.2", "loopback"],
    ["::1", "loopback"],
    ["[::1]", "loopback"],
    ["0.0.0.0", "unspecified"],
    ["::", "unspecified"],
    ["169.254.169.254", "link-local"],
    ["fe80::1", "link-local"],
    ["fe80::1%eth0", "link-local"],
    ["10.1.2.3", "private"],
    ["172.16.0.1", "private"],
    ["172.31.255.255", "private"],
    ["192.168.1.1", "private"],
    ["100.64.0.1", "shared (CGNAT)"],
    ["fd00::1", "unique-local"],
    ["fc12:3456::1", "unique-local"],
    ["224.0.0.1", "multicast"],
    ["ff02::1", "multicast"],
    ["255.255.255.255", "reserved"],
    ["::ffff:127.0.0.1", "loopback"],
    ["::ffff:7f00:1", "loopback"],
    ["::ffff:169.254.169.254", "link-local"],
    ["::ffff:a9fe:a9fe", "link-local"],
    ["64:ff9b::7f00:1", "loopback"],
    ["64:ff9b::10.0.0.1", "private"],
    ["2002:7f00:1::1", "loopback"],
    ["::127.0.0.1", "IPv4-compatible"],
    ["2001:db8::1", "documentation"],
  ];
  for (const [a, w] of refused) assert.equal(why(a), w, a);
  for (const a of ["8.8.8.8", "1.1.1.1", "172.32.0.1", "192.169.0.1", "2606:4700::1111", "::ffff:8.8.8.8"]) {
    assert.equal(why(a), null, a);
  }
  // The host's own addresses, public or not, also in their mapped form.
  assert.equal(why("8.8.8.8", ["8.8.8.8"]), "this host's own");
  assert.equal(why("::ffff:8.8.8.8", ["8.8.8.8"]), "this host's own");
  assert.equal(why("2606:4700::1111", ["2606:4700::1111"]), "this host's own");
  for (const junk of ["", "localhost", "1.2.3", "::g", "1.2.3.4.5"]) assert.equal(ipBytes(junk), null, junk);
  // The loopback and the interfaces of this host are among its own addresses.
  const own = hostAddresses();
  assert.ok(own.has(ipKey(ipBytes("127.0.0.1") ?? new Uint8Array(16))));
});

test("the operator's list: host or host:port, normalized as URLs spell them; junk refused", () => {
  assert.deepEqual(parseAllowedHosts(" Registry.Internal:5000, localhost,[::1]:5001 ,10.0.0.7"), [
    { hostname: "registry.internal", port: "5000" },
    { hostname: "localhost", port: null },
    { hostname: "[::1]", port: "5001" },
    { hostname: "10.0.0.7", port: null },
  ]);
  assert.deepEqual(parseAllowedHosts(""), []);
  for (const junk of ["http://x", "x/y", "x:0", "x:99999", "a b", "[zz]"]) {
    assert.throws(() => parseAllowedHosts(junk), /FORKD_TENANT_REGISTRIES/, junk);
  }
});

// ---------------------------------------------------------------- the transport

let server: Server;
let port = 0;
let hits = 0;
let redirectTo = "";

before(async () => {
  server = createServer((req, res) => {
    hits++;
    if (req.url === "/redirect") {
      res.writeHead(307, { location: redirectTo });
      res.end();
      return;
    }
    res.writeHead(200, { "content-type": "text/plain" });
    res.end("secret\n");
  });
  // Every address of this host: its interfaces' too.
  await new Promise<void>((r) => server.listen(0, "::", r));
  port = (server.address() as AddressInfo).port;
});

after(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

/** A guard whose names resolve as `dns` says (else the system's resolver), with `allowed` hosts. */
function guard(allowed = "", dns: Record<string, () => string> = {}): TenantGuard {
  const real = tenantGuard(parseAllowedHosts(allowed));
  return {
    ...real,
    resolve: (hostname: string): Promise<LookupAddress[]> => {
      const f = dns[hostname];
      if (!f) return real.resolve(hostname);
      const address = f();
      return Promise.resolve([{ address, family: address.includes(":") ? 6 : 4 }]);
    },
  };
}

const policy = (tenant?: TenantGuard): SchemePolicy => ({ insecure: true, ...(tenant ? { tenant } : {}) });

async function get(url: string, tenant?: TenantGuard): Promise<string> {
  const s = await send(new URL(url), { method: "GET", policy: policy(tenant), idleMs: 10_000, what: "test" });
  return (await readLimited(s, 1 << 20)).toString("utf8");
}

const forbidden = (host: string) => (e: unknown) => {
  assert.ok(e instanceof ForkdError, String(e));
  assert.equal(e.code, "forbidden", e.message);
  assert.match(e.message, /a tenant's image may come only from a registry on a public address/);
  assert.ok(e.message.includes(`refusing ${host}:`), e.message);
  return true;
};

/** A non-loopback address of one of this host's interfaces. */
function interfaceAddress(): string | null {
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) if (!a.internal && a.family === "IPv4") return a.address;
  }
  return null;
}

test("transport: the operator reaches loopback and the host's addresses; a tenant is refused before connecting", async () => {
  const g = guard("", { "registry.rebound.test": () => "127.0.0.1" });
  const mine = interfaceAddress();
  assert.equal(await get(`http://127.0.0.1:${port}/`), "secret\n");
  assert.equal(await get(`http://localhost:${port}/`), "secret\n");
  if (mine) assert.equal(await get(`http://${mine}:${port}/`), "secret\n");
  const before = hits;
  const targets = [
    `127.0.0.1:${port}`,
    `localhost:${port}`,
    `[::1]:${port}`,
    `[::ffff:7f00:1]:${port}`,
    `0.0.0.0:${port}`,
    `169.254.169.254`,
    `[fe80::1]:${port}`,
    `registry.rebound.test:${port}`,
    ...(mine ? [`${mine}:${port}`] : []),
  ];
  for (const host of targets) {
    await assert.rejects(get(`http://${host}/v2/`, g), forbidden(host), host);
  }
  // Also given in a form the URL parser rewrites (the check is on the address connected to).
  await assert.rejects(get(`http://2130706433:${port}/v2/`, g), forbidden(`127.0.0.1:${port}`));
  assert.equal(hits, before, "nothing reached the server");
  // An open port and a closed one get the same answer.
  const closed = await freePort();
  const answer = async (p: number) =>
    get(`http://127.0.0.1:${p}/v2/`, g).then(
      () => "reached",
      (e: unknown) => (e instanceof Error ? e.message.replaceAll(String(p), "PORT") : String(e)),
    );
  assert.equal(await answer(port), await answer(closed));
});

test("transport: a registry the operator allows by name is reached; a redirect from it to loopback is not", async () => {
  const g = guard(`localhost:${port}`);
  assert.equal(await get(`http://localhost:${port}/v2/`, g), "secret\n");
  // By name only: the same registry by its address is still refused.
  await assert.rejects(get(`http://127.0.0.1:${port}/v2/`, g), forbidden(`127.0.0.1:${port}`));
  // Another port of the allowed name is not allowed.
  await assert.rejects(get(`http://localhost:${port + 1}/v2/`, g), forbidden(`localhost:${port + 1}`));
  redirectTo = `http://127.0.0.1:${port}/blob`;
  const before = hits;
  await assert.rejects(get(`http://localhost:${port}/redirect`, g), forbidden(`127.0.0.1:${port}`));
  assert.equal(hits, before + 1, "only the redirect itself was served");
  // The operator's own request follows it.
  assert.equal(await get(`http://localhost:${port}/redirect`), "secret\n");
});

test("client: a token realm on loopback, named by a registry the operator allows, is refused to a tenant", async () => {
  let tokenAsked = 0;
  const fake = createServer((req, res) => {
    if (req.url?.startsWith("/token")) {
      tokenAsked++;
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ token: "t" }));
      return;
    }
    res.writeHead(401, { "www-authenticate": `Bearer realm="http://127.0.0.1:${fakePort}/token"` });
    res.end();
  });
  await new Promise<void>((r) => fake.listen(0, "127.0.0.1", r));
  const fakePort = (fake.address() as AddressInfo).port;
  try {
    const client = (tenant?: TenantGuard) =>
      new RegistryClient(parseRef(`localhost:${fakePort}/a/b:v1`), {
        insecure: false,
        credentials: () => Promise.resolve(null),
        chunkBytes: 1 << 20,
        idleMs: 10_000,
        push: false,
        ...(tenant ? { tenant } : {}),
      });
    await assert.rejects(
      client(guard(`localhost:${fakePort}`)).getManifest("v1", ["application/json"], 1 << 20),
      forbidden(`127.0.0.1:${fakePort}`),
    );
    assert.equal(tokenAsked, 0);
    // The operator's client asks it (and is refused by the registry: the fake takes no token).
    await assert.rejects(client().getManifest("v1", ["application/json"], 1 << 20), /answered 401/);
    assert.equal(tokenAsked, 1);
  } finally {
    fake.closeAllConnections();
    await new Promise((r) => fake.close(r));
  }
});

test("transport: a name that resolves to a public address, then to loopback when connecting, is refused", async () => {
  let calls = 0;
  const g = guard("", { "registry.rebind.test": () => (calls++ === 0 ? "93.184.216.34" : "127.0.0.1") });
  const url = new URL(`http://registry.rebind.test:${port}/v2/`);
  await assertReachable(url, g, "test"); // the first answer: public
  const before = hits;
  await assert.rejects(get(url.toString(), g), forbidden(`registry.rebind.test:${port}`));
  assert.equal(calls, 2, "the connection made its own lookup");
  assert.equal(hits, before);
});

// ---------------------------------------------------------------- the image puller

let work = "";
let reg: TestRegistry | undefined;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-reach-"));
  await mkdir(join(work, "registry"));
  reg = await startRegistry(join(work, "registry"));
});
after(async () => {
  await reg?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

const settings = (allowed = ""): RegistrySettings => ({
  credentials: () => Promise.resolve(null),
  insecureHosts: [],
  chunkBytes: 64 << 20,
  idleMs: 30_000,
  tenant: tenantGuard(parseAllowedHosts(allowed)),
});

test("puller: the admin's pull from a loopback registry works; a tenant's is refused, cached or not; the operator's list admits it", async () => {
  assert.ok(reg);
  const img = await pushImage(reg.host, "reach/busybox", "v1", [{ tar: busyboxTar(), compression: "gzip" }]);
  const puller = new ImagePuller({ cacheDir: join(work, "cache"), settings: settings() });
  await assert.rejects(puller.ensure(img.ref, undefined, undefined, "tenant"), forbidden(reg.host));
  await assert.rejects(puller.admit(img.ref, "tenant"), forbidden(reg.host));
  const pulled = await puller.ensure(img.ref);
  assert.equal(pulled.digest, img.digest);
  await puller.admit(img.ref, "operator");
  // Cached now: a pull by digest would need no request, and is refused all the same.
  const byDigest = `${reg.host}/reach/busybox@${img.digest}`;
  await assert.rejects(puller.ensure(byDigest, undefined, undefined, "tenant"), forbidden(reg.host));
  // The operator allows the registry by name: a tenant pulls through that name.
  const port = reg.host.split(":")[1] ?? "";
  const allowing = new ImagePuller({
    cacheDir: join(work, "cache"),
    settings: settings(`localhost:${port}`),
  });
  const viaName = await allowing.ensure(`localhost:${port}/reach/busybox:v1`, undefined, undefined, "tenant");
  assert.equal(viaName.digest, img.digest);
  await assert.rejects(
    allowing.ensure(img.ref, undefined, undefined, "tenant"),
    forbidden(reg.host),
    "the address is not the name",
  );
});

test("credentials: the operator's go to a host a tenant names only when FORKD_REGISTRY_HOSTS lists it", async () => {
  const env = { FORKD_REGISTRY_USER: "op", FORKD_REGISTRY_PASSWORD: "pw", DOCKER_CONFIG: "/nonexistent" };
  const everywhere = credentialsFromEnv(env);
  assert.deepEqual(await everywhere("evil.example.com"), { username: "op", password: "pw" });
  assert.equal(await everywhere("evil.example.com", { namedOnly: true }), null);
  const listed = credentialsFromEnv({ ...env, FORKD_REGISTRY_HOSTS: "registry.example.com" });
  assert.deepEqual(await listed("registry.example.com", { namedOnly: true }), {
    username: "op",
    password: "pw",
  });
  assert.equal(await listed("evil.example.com", { namedOnly: true }), null);
});
