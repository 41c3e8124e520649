/**
 * What tenants are told about the host: error replies to a non-admin TCP caller name no path
 * under the daemon's directories (the admin's keep them); an unknown template is a 400 that
 * names the known ones.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/api/app.js";
import { redactHostPaths } from "../../src/app/redact.js";
import { redactNdjson } from "../../src/api/redact.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { ImageBuilder } from "../../src/image/builder.js";
import { ForkdError } from "../../src/util/errors.js";
import { contractValidator } from "../helpers/contract.js";
import { testServices } from "../helpers/services.js";
import type { TestServices } from "../helpers/services.js";

const ADMIN = "t".repeat(20) + "0123456789abcdef";
let t: TestServices;
let app: ReturnType<typeof createApp>;
let alice = "";

before(async () => {
  t = await testServices();
  app = createApp(t.services, t.tcp(ADMIN));
  alice = (await t.services.tokens.create({ tenant: "alice", scope: "tenant" })).token;
  // A snapshot of alice's whose metadata is unreadable: its error names the file. (A shared
  // one's owner cannot be read: a tenant is told it is not there.)
  await mkdir(join(t.dir, "snapshots", "alice~broken"));
  await writeFile(join(t.dir, "snapshots", "alice~broken", "meta.json"), "{not json");
});

after(async () => {
  await t.cleanup();
});

async function call(method: string, path: string, token: string, body?: string, type = "application/json") {
  const res = await app.request(path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body !== undefined ? { "content-type": type } : {}) },
    body,
  });
  const json = (await res.json()) as {
    error: { code: string; message: string; details: Record<string, unknown> };
  };
  (await contractValidator()).check(method, path, res.status, json);
  return { status: res.status, error: json.error };
}

test("a tenant's error replies name no host path; the admin's do", async () => {
  for (const [method, path, body, type] of [["GET", "/v1/snapshots/broken", undefined, undefined]] as const) {
    const tenant = await call(method, path, alice, body, type);
    // The admin names alice's snapshot with its namespace.
    const admin = await call(method, path.replace("broken", "alice%2Fbroken"), ADMIN, body, type);
    assert.equal(tenant.status, admin.status, path);
    assert.ok(admin.error.message.includes(t.dir), `the admin is told where: ${admin.error.message}`);
    assert.ok(
      !JSON.stringify(tenant.error).includes(t.dir),
      `a host path for a tenant: ${tenant.error.message}`,
    );
    assert.match(tenant.error.message, /<data>\/…\/\S+/, tenant.error.message);
  }
  // The unpack is a 400 (not a pack) that names no host path to anyone; the broken metadata a
  // 500 that says what, and where only to the admin.
  for (const token of [alice, ADMIN]) {
    const r = await call("POST", "/v1/snapshots/unpack", token, "not a pack", "application/octet-stream");
    assert.equal(r.status, 400);
    assert.ok(!JSON.stringify(r.error).includes(t.dir), `a host path: ${r.error.message}`);
  }
});

test("host paths become logical names; other paths and look-alikes stay", () => {
  const dirs = { data: "/var/lib/forkd", cache: "/var/cache/forkd", forkd: "/opt/forkd" };
  assert.equal(
    redactHostPaths("open '/var/lib/forkd/sandboxes/sb-1/disk.qcow2': ENOENT", dirs),
    "open '<data>/…/disk.qcow2': ENOENT",
  );
  assert.equal(redactHostPaths("no image at /var/cache/forkd", dirs), "no image at <cache>");
  assert.equal(redactHostPaths("/opt/forkd/guest/image/build.sh failed", dirs), "<forkd>/…/build.sh failed");
  assert.equal(
    redactHostPaths("no such file /root/a in the guest", dirs),
    "no such file /root/a in the guest",
  );
  assert.equal(redactHostPaths("/var/lib/forkd-2/x", dirs), "/var/lib/forkd-2/x");
});

test("an unknown template is invalid_argument naming the known ones", async () => {
  const cache = await mkdtemp(join(tmpdir(), "forkd-images-"));
  try {
    const b = new ImageBuilder(REPO_DIR, cache);
    assert.deepEqual(await b.templates(), ["node", "python"]);
    await assert.rejects(
      b.ensure("no-such-template"),
      (e: unknown) =>
        e instanceof ForkdError &&
        e.code === "invalid_argument" &&
        e.message === 'unknown template "no-such-template"; known: node, python',
    );
  } finally {
    await rm(cache, { recursive: true, force: true });
  }
  // Through the API: a 400 before anything is claimed or started.
  const r = await call("POST", "/v1/snapshots", ADMIN, JSON.stringify({ tag: "t1", template: "nope" }));
  assert.equal(r.status, 400);
  assert.equal(r.error.code, "invalid_argument");
  assert.match(r.error.message, /^unknown template "nope"; known: /);
});

test("a tenant's NDJSON: message events rewritten at any chunking, output lines untouched", async () => {
  const dirs = { data: "/var/lib/forkd" };
  const lines = [
    { type: "started", pid: 7 },
    {
      type: "stdout",
      data: Buffer.from("/var/lib/forkd/x is the guest's own business\n").toString("base64"),
    },
    { type: "progress", message: "boot: /var/lib/forkd/run/p-1/qmp.sock" },
    { type: "stderr", data: "x".repeat(5000) },
    {
      type: "error",
      error: { code: "vmm_error", message: "QEMU: /var/lib/forkd/run/p-1/qemu.log", details: {} },
    },
  ];
  const input = Buffer.from(lines.map((l) => JSON.stringify(l) + "\n").join(""));
  const want = lines
    .map((l) =>
      JSON.stringify(
        l.type === "progress"
          ? { ...l, message: "boot: <data>/…/qmp.sock" }
          : l.type === "error"
            ? { type: "error", error: { code: "vmm_error", message: "QEMU: <data>/…/qemu.log", details: {} } }
            : l,
      ),
    )
    .join("\n")
    .concat("\n");
  for (const size of [1, 2, 7, 64, 1000, input.length]) {
    const chunks: Uint8Array[] = [];
    for (let i = 0; i < input.length; i += size) chunks.push(new Uint8Array(input.subarray(i, i + size)));
    const out = new ReadableStream<Uint8Array>({
      start(c) {
        for (const ch of chunks) c.enqueue(ch);
        c.close();
      },
    }).pipeThrough(redactNdjson(dirs));
    const got: Buffer[] = [];
    for await (const ch of out) got.push(Buffer.from(ch));
    assert.equal(Buffer.concat(got).toString(), want, `chunks of ${size}`);
  }
});
