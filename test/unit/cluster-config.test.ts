/**
 * A node's cluster settings (src/daemon/config.ts readClusterConfig, cluster-secret.ts): none
 * without FORKD_CLUSTER (and a cluster-only setting alone is an error), every required one
 * named when missing, FORKD_NODE_ADDR an http(s) origin, the secret file 0600 with at least 32
 * bytes.
 */
import assert from "node:assert/strict";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { ClusterSecret } from "../../src/access/index.js";
import { httpOrigin, readClusterConfig } from "../../src/daemon/config.js";
import { ForkdError } from "../../src/util/errors.js";

async function withSecret(content: string, mode: number, fn: (path: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-secret-"));
  const path = join(dir, "secret");
  await writeFile(path, content);
  await chmod(path, mode);
  try {
    await fn(path);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const GOOD = "f".repeat(64) + "\n";
const base = (secret: string): NodeJS.ProcessEnv => ({
  FORKD_CLUSTER: "etcd://127.0.0.1:2379,10.0.0.2:2379",
  FORKD_NODE_ID: "node-1",
  FORKD_NODE_ADDR: "http://10.0.0.5:7000/",
  FORKD_LISTEN: "0.0.0.0:7000",
  FORKD_CLUSTER_SECRET_FILE: secret,
});
const refused = (field: string, text: RegExp) => (e: unknown) =>
  e instanceof ForkdError &&
  e.code === "invalid_argument" &&
  e.details.field === field &&
  text.test(e.message);

test("no FORKD_CLUSTER: alone (null); a cluster-only setting without it is refused", async () => {
  assert.equal(await readClusterConfig({}), null);
  await assert.rejects(
    readClusterConfig({ FORKD_NODE_ID: "a" }),
    refused("FORKD_NODE_ID", /set FORKD_CLUSTER/),
  );
});

test("a node's settings: endpoints, id, origins, prefix, the secret (its trailing newline not part of it)", async () => {
  await withSecret(GOOD, 0o600, async (path) => {
    const c = await readClusterConfig({ ...base(path), FORKD_CLUSTER_PREFIX: "/prod/" });
    assert.ok(c);
    assert.deepEqual(c.endpoints, { tls: false, hosts: ["127.0.0.1:2379", "10.0.0.2:2379"] });
    assert.equal(c.nodeId, "node-1");
    assert.equal(c.api, "http://10.0.0.5:7000");
    assert.equal(c.e2b, null);
    assert.equal(c.keys.node("node-1"), "/prod/nodes/node-1");
    assert.equal(
      c.secret.bearer("x"),
      ClusterSecret.of(Buffer.from(GOOD.trim())).bearer("x"),
      "the file's bytes",
    );
  });
});

test("every missing or malformed setting is named", async () => {
  await withSecret(GOOD, 0o600, async (path) => {
    const env = base(path);
    const without = (k: string) => Object.fromEntries(Object.entries(env).filter(([n]) => n !== k));
    await assert.rejects(
      readClusterConfig(without("FORKD_NODE_ID")),
      refused("FORKD_NODE_ID", /needs FORKD_NODE_ID/),
    );
    await assert.rejects(
      readClusterConfig({ ...env, FORKD_NODE_ID: "Node_1" }),
      refused("FORKD_NODE_ID", /must match/),
    );
    await assert.rejects(readClusterConfig(without("FORKD_NODE_ADDR")), refused("FORKD_NODE_ADDR", /needs/));
    await assert.rejects(
      readClusterConfig(without("FORKD_LISTEN")),
      refused("FORKD_LISTEN", /needs FORKD_LISTEN/),
    );
    await assert.rejects(
      readClusterConfig(without("FORKD_CLUSTER_SECRET_FILE")),
      refused("FORKD_CLUSTER_SECRET_FILE", /needs FORKD_CLUSTER_SECRET_FILE/),
    );
    await assert.rejects(
      readClusterConfig({ ...env, FORKD_NODE_E2B_ADDR: "http://10.0.0.5:7001" }),
      refused("FORKD_NODE_E2B_ADDR", /needs FORKD_E2B_LISTEN/),
    );
    await assert.rejects(
      readClusterConfig({ ...env, FORKD_CLUSTER: "http://x:1" }),
      (e: unknown) => e instanceof ForkdError,
    );
    await assert.rejects(
      readClusterConfig({ ...env, FORKD_CLUSTER_PREFIX: "nope" }),
      (e: unknown) => e instanceof ForkdError,
    );
    await assert.rejects(
      readClusterConfig({ ...env, FORKD_CLUSTER_CA: "/ca.pem" }),
      refused("FORKD_CLUSTER", /etcds:\/\//),
    );
  });
});

test("FORKD_NODE_ADDR: an http(s) origin, normalized; a path, a query, credentials or another scheme refused", () => {
  assert.equal(httpOrigin("X", "http://10.0.0.5:7000"), "http://10.0.0.5:7000");
  assert.equal(httpOrigin("X", "https://node-1.example:443/"), "https://node-1.example");
  assert.equal(httpOrigin("X", "http://[fd00::5]:7000"), "http://[fd00::5]:7000");
  for (const bad of [
    "10.0.0.5:7000",
    "http://h:1/api",
    "http://h:1/?x=1",
    "http://u:p@h:1",
    "ftp://h:1",
    "http://",
    "",
  ])
    assert.throws(
      () => httpOrigin("X", bad),
      (e: unknown) => e instanceof ForkdError && e.details.field === "X",
      bad,
    );
});

test("the secret file: 0600 (no group or other bits), at least 32 bytes", async () => {
  await withSecret(GOOD, 0o644, async (path) => {
    await assert.rejects(readClusterConfig(base(path)), refused("FORKD_CLUSTER_SECRET_FILE", /mode 644/));
  });
  await withSecret("short\n", 0o600, async (path) => {
    await assert.rejects(
      readClusterConfig(base(path)),
      refused("FORKD_CLUSTER_SECRET_FILE", /holds 5 bytes/),
    );
  });
  await withSecret(GOOD, 0o400, async (path) => {
    assert.ok(await readClusterConfig(base(path)));
  });
  await assert.rejects(
    readClusterConfig(base("/nonexistent/secret")),
    refused("FORKD_CLUSTER_SECRET_FILE", /cannot be read/),
  );
});
