/**
 * The SDK's route-level ApiClient (what the CLI uses) over https with a private CA (the `ca`
 * option; without it the daemon's certificate is refused), and an upload whose source fails:
 * the call rejects with the source's error, not as an unreachable daemon.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer } from "node:https";
import type { Server } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { ApiClient, ConnectionError } from "@forkd/sdk";
import { selfSignedCert } from "../helpers/tls.js";

let dir = "";
let ca: Buffer;
let server: Server;
let url = "";
const seen: string[] = [];

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "forkd-sdk-tls-"));
  const tls = await selfSignedCert(dir);
  ca = tls.pem;
  server = createServer({ key: await readFile(tls.key), cert: ca }, (req, res) => {
    seen.push(`${req.method} ${req.url} ${req.headers.authorization ?? "-"}`);
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ ok: true, tag: "t", published: ["t"] }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
  await rm(dir, { recursive: true, force: true });
});

test("https with the daemon's CA given as `ca` works; without it the certificate is refused", async () => {
  const ok = await new ApiClient({ url, token: "tok", ca }).health({ timeoutMs: 5_000 });
  assert.equal(ok.ok, true);
  assert.equal(seen.at(-1), "GET /v1/health Bearer tok");
  await assert.rejects(new ApiClient({ url, token: "tok" }).health({ timeoutMs: 5_000 }), ConnectionError);
});

test("an upload whose source fails rejects with that error", async () => {
  const broken = new Readable({
    read() {
      this.destroy(new Error("the pack file cannot be read"));
    },
  });
  await assert.rejects(new ApiClient({ url, token: "", ca }).unpack(broken, { timeoutMs: 5_000 }), {
    message: "the pack file cannot be read",
  });
});
