/**
 * Bad input at the API edge gets a 4xx with the error envelope and touches nothing on disk.
 * No VM is needed: every request here must be refused before one would start.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { createApp } from "../../src/api/app.js";
import { testServices } from "../helpers/services.js";
import { readdir } from "node:fs/promises";

let dir: string;
let app: ReturnType<typeof createApp>;
let cleanup: () => Promise<void>;

before(async () => {
  const t = await testServices();
  dir = t.dir;
  cleanup = t.cleanup;
  app = createApp(t.services);
});

after(async () => {
  await cleanup();
});

async function call(method: string, path: string, body?: unknown, raw?: string) {
  const res = await app.request(path, {
    method,
    headers: body !== undefined || raw !== undefined ? { "content-type": "application/json" } : {},
    body: raw ?? (body === undefined ? undefined : JSON.stringify(body)),
  });
  const json = (await res.json()) as { error?: { code: string; message: string } };
  return { status: res.status, json };
}

const cases: Array<[string, string, string, unknown, number, string, string?]> = [
  ["unknown snapshot tag", "POST", "/v1/sandboxes", { snapshot_tag: "nope", n: 1 }, 404, "not_found"],
  ["path-traversal tag", "POST", "/v1/sandboxes", { snapshot_tag: "../etc", n: 1 }, 400, "invalid_argument"],
  ["n = 0", "POST", "/v1/sandboxes", { snapshot_tag: "py", n: 0 }, 400, "invalid_argument"],
  ["n = 1001", "POST", "/v1/sandboxes", { snapshot_tag: "py", n: 1001 }, 400, "invalid_argument"],
  ["n not an integer", "POST", "/v1/sandboxes", { snapshot_tag: "py", n: 1.5 }, 400, "invalid_argument"],
  [
    "unknown field",
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: "py", n: 1, evil: true },
    400,
    "invalid_argument",
  ],
  [
    "idle timeout below 1 s",
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: "py", timeout_ms: 10 },
    400,
    "invalid_argument",
  ],
  [
    "metadata value not a string",
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: "py", metadata: { a: 1 } },
    400,
    "invalid_argument",
  ],
  [
    "metadata with 33 keys",
    "POST",
    "/v1/sandboxes",
    {
      snapshot_tag: "py",
      metadata: Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, "v"])),
    },
    400,
    "invalid_argument",
  ],
  [
    "set timeout, unknown sandbox",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/timeout",
    { timeout_ms: null },
    404,
    "not_found",
  ],
  [
    "set timeout, missing field",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/timeout",
    {},
    400,
    "invalid_argument",
  ],
  [
    "signal, pid not a number",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/commands/abc/signal",
    {},
    400,
    "invalid_argument",
  ],
  [
    "signal, pid 0",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/commands/0/signal",
    {},
    400,
    "invalid_argument",
  ],
  [
    "signal, unknown name",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/commands/5/signal",
    { signal: "SIGBOGUS" },
    400,
    "invalid_argument",
  ],
  [
    "signal, unknown sandbox",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/commands/5/signal",
    {},
    404,
    "not_found",
  ],
  ["stdin, bad sandbox id", "POST", "/v1/sandboxes/nope/commands/5/stdin", {}, 400, "invalid_argument"],
  [
    "branch, bad tag",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/branch",
    { tag: "../x" },
    400,
    "invalid_argument",
  ],
  [
    "branch, unknown field",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/branch",
    { live: true },
    400,
    "invalid_argument",
  ],
  ["branch, unknown sandbox", "POST", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/branch", {}, 404, "not_found"],
  ["pause, unknown sandbox", "POST", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/pause", undefined, 404, "not_found"],
  ["resume, bad id", "POST", "/v1/sandboxes/..%2F..%2Fetc/resume", undefined, 400, "invalid_argument"],
  [
    "on_idle not kill or pause",
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: "py", on_idle: "sleep" },
    400,
    "invalid_argument",
  ],
  ["compact, bad new tag", "POST", "/v1/snapshots/missing/compact", { tag: "../b" }, 400, "invalid_argument"],
  ["compact, unknown snapshot", "POST", "/v1/snapshots/missing/compact", { tag: "new" }, 404, "not_found"],
  ["info, unknown snapshot", "GET", "/v1/snapshots/missing/info", undefined, 404, "not_found"],
  [
    "delete with cascade and force",
    "DELETE",
    "/v1/snapshots/missing?cascade=1&force=1",
    undefined,
    400,
    "invalid_argument",
  ],
  [
    "delete with a bad flag",
    "DELETE",
    "/v1/snapshots/missing?cascade=maybe",
    undefined,
    400,
    "invalid_argument",
  ],
  [
    "commands, unknown sandbox",
    "GET",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/commands",
    undefined,
    404,
    "not_found",
  ],
  ["body not JSON", "POST", "/v1/sandboxes", undefined, 400, "invalid_argument", "{not json"],
  ["body an array", "POST", "/v1/snapshots", [], 400, "invalid_argument"],
  ["snapshot bad tag", "POST", "/v1/snapshots", { tag: "../b" }, 400, "invalid_argument"],
  [
    "snapshot memory too small",
    "POST",
    "/v1/snapshots",
    { tag: "ok", memory_mib: 1 },
    400,
    "invalid_argument",
  ],
  [
    "snapshot bad template",
    "POST",
    "/v1/snapshots",
    { tag: "ok", template: "../x" },
    400,
    "invalid_argument",
  ],
  [
    "snapshot from both a template and an image",
    "POST",
    "/v1/snapshots",
    { tag: "ok", template: "python", image: "busybox:latest" },
    400,
    "invalid_argument",
  ],
  [
    "snapshot image reference with a space",
    "POST",
    "/v1/snapshots",
    { tag: "ok", image: "busybox latest" },
    400,
    "invalid_argument",
  ],
  [
    "snapshot warm_eval in a language that is no kernel",
    "POST",
    "/v1/snapshots",
    { tag: "ok", warm_eval: "1", warm_eval_language: "ruby" },
    400,
    "invalid_argument",
  ],
  ["snapshot empty image", "POST", "/v1/snapshots", { tag: "ok", image: "" }, 400, "invalid_argument"],
  [
    "snapshot empty start_cmd",
    "POST",
    "/v1/snapshots",
    { tag: "ok", image: "busybox", start_cmd: "" },
    400,
    "invalid_argument",
  ],
  [
    "snapshot ready timeout below 1 s",
    "POST",
    "/v1/snapshots",
    { tag: "ok", image: "busybox", ready_cmd: "true", ready_timeout_ms: 10 },
    400,
    "invalid_argument",
  ],
  [
    "snapshot from an image without an image puller",
    "POST",
    "/v1/snapshots",
    { tag: "ok", image: "busybox:latest" },
    503,
    "unavailable",
  ],
  [
    "streamed snapshot from an image without an image puller",
    "POST",
    "/v1/snapshots?stream=1",
    { tag: "ok", image: "busybox:latest" },
    503,
    "unavailable",
  ],
  ["get bad tag", "GET", "/v1/snapshots/..%2Fetc", undefined, 400, "invalid_argument"],
  ["get unknown tag", "GET", "/v1/snapshots/missing", undefined, 404, "not_found"],
  ["delete unknown tag", "DELETE", "/v1/snapshots/missing", undefined, 404, "not_found"],
  ["bad sandbox id", "GET", "/v1/sandboxes/sb-NOT_AN_ID", undefined, 400, "invalid_argument"],
  ["unknown sandbox id", "GET", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa", undefined, 404, "not_found"],
  [
    "exec in unknown sandbox",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/exec",
    { cmd: ["true"] },
    404,
    "not_found",
  ],
  ["exec empty argv", "POST", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/exec", { cmd: [] }, 400, "invalid_argument"],
  [
    "exec bad env name",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/exec",
    { cmd: ["true"], env: { "A=B": "x" } },
    400,
    "invalid_argument",
  ],
  [
    "exec negative timeout",
    "POST",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/exec",
    { cmd: ["true"], timeout_ms: -1 },
    400,
    "invalid_argument",
  ],
  [
    "relative file path",
    "GET",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/files?path=etc/passwd",
    undefined,
    400,
    "invalid_argument",
  ],
  [
    "missing file path",
    "GET",
    "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/files/stat",
    undefined,
    400,
    "invalid_argument",
  ],
  ["eval without code", "POST", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/eval", {}, 400, "invalid_argument"],
  ["unknown route", "GET", "/v1/nothing", undefined, 404, "not_found"],
];

for (const [name, method, path, body, status, code, raw] of cases) {
  test(`bad input: ${name} -> ${status} ${code}`, async () => {
    const r = await call(method, path, body, raw);
    assert.equal(r.status, status, JSON.stringify(r.json));
    assert.equal(r.json.error?.code, code);
    assert.ok((r.json.error?.message ?? "").length > 0);
  });
}

test("refused requests leave nothing on disk", async () => {
  assert.deepEqual(await readdir(join(dir, "snapshots")), []);
  assert.deepEqual(await readdir(join(dir, "sandboxes")), []);
});

test("a valid body with an unknown tag reaches the store (not the VMM)", async () => {
  const r = await call("POST", "/v1/sandboxes", { snapshot_tag: "valid-but-missing" });
  assert.equal(r.status, 404);
  assert.match(r.json.error?.message ?? "", /valid-but-missing/);
});

test("a request body cut short by its client is a 400, not a 500", async () => {
  let sent = false;
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (!sent) {
        sent = true;
        c.enqueue(new Uint8Array(1024));
      } else c.error(new Error("aborted"));
    },
  });
  const res = await app.request("/v1/snapshots/unpack", {
    method: "POST",
    headers: { "content-type": "application/octet-stream" },
    body,
    duplex: "half",
  });
  const json = (await res.json()) as { error: { code: string; message: string } };
  assert.equal(res.status, 400, JSON.stringify(json));
  assert.equal(json.error.code, "invalid_argument");
  assert.match(json.error.message, /cut short/);
  const staged = (await readdir(join(dir, "snapshots")).catch(() => [])).filter((n) => n.startsWith("."));
  assert.deepEqual(staged, []);
});
