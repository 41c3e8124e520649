/**
 * TLS to a cluster's nodes: a node's https address as a relay's upstream (verified against the
 * gateway's trust, for the address's host), FORKD_NODE_CA_FILE read and checked once (a file
 * without a certificate, one that does not parse or cannot be read stops the start, on a gateway
 * and on a node), and a node's pulls from an https peer verified against the same CA.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:https";
import type { Server } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { SecureContext } from "node:tls";
import { readAccessConfig } from "../../src/daemon/config.js";
import { readGatewayConfig } from "../../src/daemon/gateway.js";
import { upstreamOf } from "../../src/gateway/upstream-of.js";
import { connectTo, readyEvent, requestTo } from "../../src/http/upstream.js";
import type { Upstream } from "../../src/http/upstream.js";
import { fetchPeerManifest } from "../../src/snapshot/peer-client.js";
import { ForkdError } from "../../src/util/errors.js";
import { nodeTrust, readNodeTrust } from "../../src/util/node-trust.js";
import { selfSignedCert } from "../helpers/tls.js";
import type { TestCert } from "../helpers/tls.js";

/** A scratch dir with a self-signed certificate for 127.0.0.1, and its trust. */
async function withCert(
  fn: (dir: string, cert: TestCert, trust: SecureContext) => Promise<void>,
): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-node-tls-"));
  try {
    const cert = await selfSignedCert(dir);
    await fn(dir, cert, nodeTrust("FORKD_NODE_CA_FILE", cert.cert, cert.pem.toString("utf8")));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** An https server on 127.0.0.1 with `cert`, answering every request 404 "none here". */
async function httpsServer(cert: TestCert): Promise<{ server: Server; port: number }> {
  const server = createServer({ cert: cert.pem, key: await readFile(cert.key) }, (_req, res) => {
    res.writeHead(404, { "content-type": "text/plain" });
    res.end("none here");
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return { server, port: (server.address() as AddressInfo).port };
}

const statusOf = (to: Upstream): Promise<number | string> =>
  new Promise((resolve) => {
    const req = requestTo(to, { method: "GET", path: "/", agent: false });
    req.on("response", (r) => {
      r.resume();
      resolve(r.statusCode ?? 0);
    });
    req.on("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
    req.end();
  });

test("a node's https address is a TLS upstream with the gateway's trust; other schemes are refused", async () => {
  await withCert(async (_dir, _cert, trust) => {
    assert.deepEqual(upstreamOf("https://10.0.0.5:7443", trust), {
      host: "10.0.0.5",
      port: 7443,
      tls: { trust },
    });
    assert.deepEqual(upstreamOf("https://node-a.cluster", null), {
      host: "node-a.cluster",
      port: 443,
      tls: { trust: null },
    });
    // http stays plain, whatever the trust; an IPv6 host loses its brackets.
    assert.deepEqual(upstreamOf("http://[fd00::5]:7000", trust), { host: "fd00::5", port: 7000 });
    assert.deepEqual(upstreamOf("http://node-b", trust), { host: "node-b", port: 80 });
    for (const [origin, why] of [
      ["ftp://node-c:21", /the gateway relays to http and https nodes only, not ftp:\/\//],
      ["unix:/run/forkd.sock", /http and https nodes only, not unix:\/\//],
      ["node-d:7000", /http and https nodes only/],
      ["not a url", /a node's address is not a URL/],
    ] as const)
      assert.throws(
        () => upstreamOf(origin, trust),
        (e: unknown) => e instanceof ForkdError && e.code === "unavailable" && why.test(e.message),
        origin,
      );
  });
});

test("a TLS upstream's certificate is verified: against the trust given, for the address's host", async () => {
  await withCert(async (dir, cert, trust) => {
    const { server, port } = await httpsServer(cert);
    const other = await selfSignedCert(await mkdtemp(join(dir, "other-")));
    const otherTrust = nodeTrust("FORKD_NODE_CA_FILE", other.cert, other.pem.toString("utf8"));
    try {
      const at = (host: string, t: SecureContext | null): Upstream => ({ host, port, tls: { trust: t } });
      assert.equal(await statusOf(at("127.0.0.1", trust)), 404);
      // Node's CAs alone, or another CA: the self-signed certificate is refused.
      assert.equal(await statusOf(at("127.0.0.1", null)), "DEPTH_ZERO_SELF_SIGNED_CERT");
      assert.equal(await statusOf(at("127.0.0.1", otherTrust)), "DEPTH_ZERO_SELF_SIGNED_CERT");
      // Trusted, but for 127.0.0.1 only: a name it is not for is refused.
      assert.equal(await statusOf(at("localhost", trust)), "ERR_TLS_CERT_ALTNAME_INVALID");
      // The same over a raw connection (an upgrade's): usable once the handshake verified it.
      const raw = (to: Upstream) =>
        new Promise<string>((resolve) => {
          const s = connectTo(to);
          s.once(readyEvent(to), () => {
            s.destroy();
            resolve("ready");
          });
          s.once("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
        });
      assert.equal(await raw(at("127.0.0.1", trust)), "ready");
      assert.equal(await raw(at("127.0.0.1", null)), "DEPTH_ZERO_SELF_SIGNED_CERT");
      // Plain http to a TLS listener: no handshake, no certificate, no answer it can read.
      assert.notEqual(await statusOf({ host: "127.0.0.1", port }), 404);
    } finally {
      server.close();
      server.closeAllConnections();
    }
  });
});

test("FORKD_NODE_CA_FILE: read once at start; one without a certificate, unparseable or unreadable is refused", async () => {
  await withCert(async (dir, cert) => {
    assert.equal(await readNodeTrust({}), null);
    assert.ok(await readNodeTrust({ FORKD_NODE_CA_FILE: cert.cert }));
    const refused = async (text: string | null, why: RegExp) => {
      const file = join(dir, `ca-${randomBytes(4).toString("hex")}.pem`);
      if (text !== null) await writeFile(file, text);
      await assert.rejects(
        readNodeTrust({ FORKD_NODE_CA_FILE: file }),
        (e: unknown) =>
          e instanceof ForkdError &&
          e.code === "invalid_argument" &&
          e.details.field === "FORKD_NODE_CA_FILE" &&
          why.test(e.message),
      );
    };
    await refused("", /^FORKD_NODE_CA_FILE .*: holds no PEM certificate/);
    await refused((await readFile(cert.key, "utf8")) + "\n", /holds no PEM certificate/);
    await refused(
      "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n",
      /its certificate 1 does not parse/,
    );
    await refused(null, /^cannot read FORKD_NODE_CA_FILE .*ENOENT/);
    // A bundle: every certificate in it is trusted.
    const both = join(dir, "bundle.pem");
    const other = await selfSignedCert(await mkdtemp(join(dir, "other-")));
    await writeFile(both, Buffer.concat([cert.pem, other.pem]));
    assert.ok(await readNodeTrust({ FORKD_NODE_CA_FILE: both }));
  });
});

test("a gateway and a node read FORKD_NODE_CA_FILE with their settings; a bad one stops their start", async () => {
  await withCert(async (dir, cert) => {
    const secret = join(dir, "secret");
    await writeFile(secret, randomBytes(32).toString("hex"), { mode: 0o600 });
    const bad = join(dir, "bad.pem");
    await writeFile(bad, "no certificate here\n");
    const gw = { FORKD_CLUSTER: "etcd://127.0.0.1:2379", FORKD_CLUSTER_SECRET_FILE: secret };
    assert.equal((await readGatewayConfig(gw)).nodeTrust, null);
    assert.ok((await readGatewayConfig({ ...gw, FORKD_NODE_CA_FILE: cert.cert })).nodeTrust);
    await assert.rejects(
      readGatewayConfig({ ...gw, FORKD_NODE_CA_FILE: bad }),
      /FORKD_NODE_CA_FILE .*bad\.pem/,
    );
    // A node: its peers' CA, with the cluster secret that lets it pull from them.
    const node = await readAccessConfig(
      { FORKD_CLUSTER_SECRET_FILE: secret, FORKD_NODE_CA_FILE: cert.cert },
      dir,
    );
    assert.ok(node.cluster?.nodeTrust);
    assert.equal(
      (await readAccessConfig({ FORKD_CLUSTER_SECRET_FILE: secret }, dir)).cluster?.nodeTrust,
      null,
    );
    await assert.rejects(
      readAccessConfig({ FORKD_CLUSTER_SECRET_FILE: secret, FORKD_NODE_CA_FILE: bad }, dir),
      /FORKD_NODE_CA_FILE .*holds no PEM certificate/,
    );
    await assert.rejects(
      readAccessConfig({ FORKD_NODE_CA_FILE: cert.cert }, dir),
      /FORKD_NODE_CA_FILE .* needs FORKD_CLUSTER_SECRET_FILE/,
    );
  });
});

test("a pull from an https peer verifies its certificate against FORKD_NODE_CA_FILE's CA", async () => {
  await withCert(async (_dir, cert, trust) => {
    const { server, port } = await httpsServer(cert);
    try {
      const h = { node: "peer-a", url: `https://127.0.0.1:${port}` };
      const o = { bearer: "b", idleMs: 5_000, minRate: 0, graceMs: 0 };
      // Trusted: the peer is reached (and answers it has no such snapshot).
      await assert.rejects(
        fetchPeerManifest(h, "app", { ...o, trust }),
        (e: unknown) => e instanceof ForkdError && e.code === "not_found" && /404 none here/.test(e.message),
      );
      // Node's CAs alone: refused before anything is sent.
      await assert.rejects(
        fetchPeerManifest(h, "app", o),
        (e: unknown) =>
          e instanceof ForkdError && e.code === "unavailable" && /self-signed certificate/.test(e.message),
      );
    } finally {
      server.close();
      server.closeAllConnections();
    }
  });
});
