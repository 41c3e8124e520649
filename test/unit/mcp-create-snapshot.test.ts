/**
 * The MCP server's create_snapshot tool (an in-memory MCP client, no VM): what it sends to the
 * daemon (a fake one on TCP recording each body) for a snapshot from an image with start and
 * ready commands and a JavaScript warm-up, and from a template; and what it answers: the
 * snapshot's source, or a tool error carrying the daemon's refusal.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer as createHttpServer } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { createServer } from "@forkd/mcp";

const TOKEN = "m".repeat(40);
let http: Server;
let client: Client;
const bodies: Array<Record<string, unknown>> = [];

const DIGEST = "sha256:" + "b".repeat(64);

/** POST /v1/snapshots?stream=1: a progress line, then the snapshot (or a 400 for both sources). */
function route(req: IncomingMessage, res: ServerResponse, body: string): void {
  const u = new URL(req.url ?? "/", "http://x");
  if (req.headers.authorization !== `Bearer ${TOKEN}`) {
    res.writeHead(401, { "content-type": "application/json" });
    return void res.end(JSON.stringify({ error: { code: "unauthenticated", message: "no", details: {} } }));
  }
  if (req.method !== "POST" || u.pathname !== "/v1/snapshots" || u.searchParams.get("stream") !== "1") {
    res.writeHead(404, { "content-type": "application/json" });
    return void res.end(JSON.stringify({ error: { code: "not_found", message: u.pathname, details: {} } }));
  }
  const b = JSON.parse(body) as Record<string, unknown>;
  bodies.push(b);
  if (b.image !== undefined && b.template !== undefined) {
    res.writeHead(400, { "content-type": "application/json" });
    return void res.end(
      JSON.stringify({
        error: { code: "invalid_argument", message: "give at most one of template and image", details: {} },
      }),
    );
  }
  const source =
    typeof b.image === "string"
      ? { kind: "image", ref: `127.0.0.1:5000/${b.image.split("/").pop() ?? ""}`, digest: DIGEST }
      : { kind: "template", name: (b.template as string | undefined) ?? "python" };
  const snapshot = {
    tag: b.tag,
    template: source.kind === "template" ? source.name : "image",
    source,
    created: "2026-01-01T00:00:00.000Z",
    timings: { boot_ms: 1, warm_ms: 2, freeze_ms: 3 },
  };
  res.writeHead(201, { "content-type": "application/x-ndjson" });
  res.write(JSON.stringify({ type: "progress", message: "boot", phase: "boot" }) + "\n");
  res.end(JSON.stringify({ type: "done", snapshot }) + "\n");
}

before(async () => {
  http = createHttpServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => route(req, res, Buffer.concat(chunks).toString("utf8")));
  });
  await new Promise<void>((r) => http.listen(0, "127.0.0.1", () => r()));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  const [a, b] = InMemoryTransport.createLinkedPair();
  await createServer({ url, token: TOKEN }).connect(a);
  client = new Client({ name: "forkd-unit", version: "1" });
  await client.connect(b);
});

after(async () => {
  await client.close().catch(() => undefined);
  http.closeAllConnections();
  await new Promise<void>((r) => http.close(() => r()));
});

interface ToolResult {
  isError?: boolean;
  content: Array<{ type: string; text?: string }>;
}
const call = async (args: Record<string, unknown>) =>
  (await client.callTool({ name: "create_snapshot", arguments: args })) as ToolResult;

test("create_snapshot's input schema has image, start_cmd, ready_cmd and warm_eval_language", async () => {
  const { tools } = await client.listTools();
  const t = tools.find((x) => x.name === "create_snapshot");
  const props = Object.keys(t?.inputSchema.properties ?? {});
  for (const k of [
    "tag",
    "template",
    "image",
    "start_cmd",
    "ready_cmd",
    "ready_timeout_ms",
    "warm_eval_language",
  ])
    assert.ok(props.includes(k), `${k} in ${props.join(", ")}`);
  assert.deepEqual(t?.inputSchema.required, ["tag"]);
});

test("create_snapshot from an image sends image, start/ready commands and the warm-up's language", async () => {
  bodies.length = 0;
  const r = await call({
    tag: "web",
    image: "127.0.0.1:5000/app:v1",
    start_cmd: "node server.js",
    ready_cmd: "wget -q -O- http://127.0.0.1:8000/",
    ready_timeout_ms: 30_000,
    warm_eval: "globalThis.n = 1",
    warm_eval_language: "javascript",
  });
  assert.ok(!r.isError, r.content[0]?.text);
  assert.deepEqual(bodies, [
    {
      tag: "web",
      image: "127.0.0.1:5000/app:v1",
      start_cmd: "node server.js",
      ready_cmd: "wget -q -O- http://127.0.0.1:8000/",
      ready_timeout_ms: 30_000,
      warm_eval: "globalThis.n = 1",
      warm_eval_language: "javascript",
    },
  ]);
  const out = JSON.parse(r.content[0]?.text ?? "{}") as { tag: string; source: unknown };
  assert.equal(out.tag, "web");
  assert.deepEqual(out.source, { kind: "image", ref: "127.0.0.1:5000/app:v1", digest: DIGEST });
});

test("create_snapshot from a template sends no image fields; both sources is the daemon's 400 as a tool error", async () => {
  bodies.length = 0;
  const r = await call({ tag: "py", template: "python", warm_eval: "x = 1" });
  assert.ok(!r.isError, r.content[0]?.text);
  assert.deepEqual(bodies, [{ tag: "py", template: "python", warm_eval: "x = 1" }]);
  assert.deepEqual((JSON.parse(r.content[0]?.text ?? "{}") as { source: unknown }).source, {
    kind: "template",
    name: "python",
  });
  const both = await call({ tag: "x", template: "python", image: "busybox" });
  assert.equal(both.isError, true);
  assert.match(
    both.content[0]?.text ?? "",
    /forkd error \(invalid_argument\): give at most one of template and image/,
  );
  const bad = await call({ tag: "x", warm_eval: "1", warm_eval_language: "ruby" });
  assert.equal(bad.isError, true, "a language that is no kernel is refused by the tool's schema");
});
