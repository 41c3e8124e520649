/**
 * One wire format: every key the API documents (request and response bodies, stream events,
 * parameters) is snake_case, and what the daemon serves from its own records (snapshot metadata,
 * sandbox and version views) matches the documented shapes, which allow no other keys. Records on
 * disk keep their own shapes; the views map them (src/api/views/).
 */
import { GUEST_NET } from "../../src/net/guest.js";
import { test } from "node:test";
import assert from "node:assert/strict";
import { createApp } from "../../src/api/app.js";
import { buildOpenApi } from "../../src/api/contract/openapi.js";
import { ERROR_CODES, ForkdError } from "../../src/util/errors.js";
import { writeMeta } from "../../src/snapshot/meta.js";
import type { SnapshotMeta } from "../../src/snapshot/meta.js";
import { VERSION } from "../../src/host/version.js";
import { contractValidator } from "../helpers/contract.js";
import { testServices } from "../helpers/services.js";
import { fakeSnapshot } from "../helpers/snapshots.js";

const SNAKE = /^[a-z][a-z0-9]*(_[a-z0-9]+)*$/;

type Json = Record<string, unknown>;

/** Every property name a JSON Schema (or a document holding them) declares, with where. */
function propertyNames(v: unknown, at: string, out: Array<{ name: string; at: string }>): void {
  if (Array.isArray(v)) {
    v.forEach((x, i) => propertyNames(x, `${at}[${i}]`, out));
    return;
  }
  if (v === null || typeof v !== "object") return;
  for (const [k, x] of Object.entries(v as Json)) {
    if (k === "properties" && x !== null && typeof x === "object" && !Array.isArray(x)) {
      for (const name of Object.keys(x)) out.push({ name, at: `${at}.properties` });
    }
    if (k === "required" && Array.isArray(x)) {
      for (const name of x) if (typeof name === "string") out.push({ name, at: `${at}.required` });
    }
    propertyNames(x, `${at}.${k}`, out);
  }
}

test("every property and parameter in the OpenAPI document is snake_case", () => {
  const doc = buildOpenApi(VERSION);
  const names: Array<{ name: string; at: string }> = [];
  propertyNames(doc.components, "components", names);
  propertyNames(doc.paths, "paths", names);
  // The walk really sees the document: it finds the keys every reader relies on.
  for (const known of ["exit_code", "snapshot_tag", "memory_mib", "total_ms", "code"]) {
    assert.ok(
      names.some((n) => n.name === known),
      `the walk found no ${known}`,
    );
  }
  for (const [path, methods] of Object.entries(doc.paths as Record<string, Json>)) {
    for (const [method, op] of Object.entries(methods)) {
      for (const p of ((op as Json).parameters as Array<{ name: string }> | undefined) ?? []) {
        names.push({ name: p.name, at: `${method} ${path} parameters` });
      }
    }
  }
  const bad = names.filter((n) => !SNAKE.test(n.name)).map((n) => `${n.at}: ${n.name}`);
  assert.deepEqual([...new Set(bad)], [], "keys that are not snake_case");
});

test("the wire's error code is the enum of the daemon's error codes", () => {
  const { schemas } = buildOpenApi(VERSION).components as { schemas: Record<string, Json> };
  assert.deepEqual(schemas.ErrorCode?.enum, [...ERROR_CODES]);
  const error = schemas.Error as { properties: { error: { properties: { code: Json } } } };
  assert.deepEqual(error.properties.error.properties.code, { $ref: "#/components/schemas/ErrorCode" });
});

/** Every key of a JSON value, at any depth. */
function keysOf(v: unknown, out: string[] = []): string[] {
  if (Array.isArray(v)) v.forEach((x) => keysOf(x, out));
  else if (v !== null && typeof v === "object") {
    for (const [k, x] of Object.entries(v as Json)) {
      out.push(k);
      keysOf(x, out);
    }
  }
  return out;
}

test("snapshots, pending writes and the version are served snake_case, as documented", async () => {
  const { services, cleanup } = await testServices();
  try {
    const store = services.store;
    const base = await fakeSnapshot(store, "base", null);
    // A branch with every optional part of the metadata: parent, branch, nic, state format.
    const br = await fakeSnapshot(store, "br", null);
    const { checksum: _c, ...rest } = br;
    const full: Omit<SnapshotMeta, "checksum"> = {
      ...rest,
      image: { ...rest.image, content: "c".repeat(64) },
      warmEval: "x = 1",
      stateFormat: "devices",
      nic: { ...GUEST_NET, linkUp: false },
      parent: { tag: "base", checksum: base.checksum },
      branch: { sandbox: "sb-aaaaaaaaaaaaaaaa", pauseMs: 12.5, privateBytes: 4096, finishMs: 80 },
    };
    await writeMeta(store.filesFor("br").meta, full);
    await store.recordFailed(
      { tag: "gone", started: new Date().toISOString(), source: null, owner: null },
      new ForkdError("timeout", "the parent did not answer"),
    );

    const app = createApp(services);
    const v = await contractValidator();
    const get = async (path: string): Promise<unknown> => {
      const res = await app.request(path);
      assert.equal(res.status, 200, path);
      const body = await res.json();
      v.check("get", path, 200, body);
      const camel = keysOf(body).filter((k) => !SNAKE.test(k));
      assert.deepEqual(camel, [], `${path}: keys that are not snake_case`);
      return body;
    };

    const one = (await get("/v1/snapshots/br")) as Json;
    assert.deepEqual(one.machine, { memory_mib: 128, vcpus: 1, accel: "tcg", cpu: "qemu64" });
    assert.deepEqual(one.image, {
      hash: "0",
      dir: "/nonexistent",
      kernel_version: "0",
      content: "c".repeat(64),
    });
    assert.equal(one.warm_eval, "x = 1");
    assert.equal(one.disk_size, 1 << 20);
    assert.deepEqual(one.timings, { boot_ms: 0, warm_ms: 0, freeze_ms: 0 });
    assert.equal(one.state_format, "devices");
    assert.deepEqual(one.branch, {
      sandbox: "sb-aaaaaaaaaaaaaaaa",
      pause_ms: 12.5,
      private_bytes: 4096,
      finish_ms: 80,
    });
    assert.deepEqual(one.nic, {
      mac: "52:54:00:12:34:56",
      addr: "10.0.2.15",
      prefix: 24,
      gateway: "10.0.2.2",
      dns: "10.0.2.3",
      gateway_mac: "52:55:0a:00:02:02",
      link_up: false,
    });
    assert.deepEqual(one.parent, { tag: "base", checksum: base.checksum });

    const list = (await get("/v1/snapshots")) as { snapshots: Json[]; pending: Json[] };
    assert.deepEqual(
      list.snapshots.map((s) => s.tag),
      ["base", "br"],
    );
    assert.deepEqual(list.pending, [
      {
        tag: "gone",
        status: "failed",
        started: list.pending[0]?.started,
        source: null,
        error: { code: "timeout", message: "the parent did not answer" },
        owner: null,
      },
    ]);
    await get("/v1/snapshots/gone");

    const version = (await get("/v1/version")) as { accel: Json };
    assert.deepEqual(version.accel, { accel: "tcg", reason: "test", forced: true, tsc_khz: 1 });
    await get("/v1/health");
  } finally {
    await cleanup();
  }
});
