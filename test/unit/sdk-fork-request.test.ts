/**
 * What the TypeScript SDK's Sandbox.create sends: every option in its wire name, none dropped
 * (a limit the SDK forgot to send is a limit the caller believes in and does not have).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { Sandbox } from "@forkd/sdk";

test("Sandbox.create sends every limit, the idle policy and the metadata in their wire names", async () => {
  const bodies: unknown[] = [];
  const server = createServer((req, res) => {
    let raw = "";
    req.on("data", (c: Buffer) => (raw += c.toString()));
    req.on("end", () => {
      bodies.push(JSON.parse(raw));
      // A fork in which the child failed: the SDK reports it without needing a sandbox view.
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "vmm_error", message: "no VMs here", details: {} } }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    await assert.rejects(
      Sandbox.create("py", {
        url,
        token: "t".repeat(40),
        timeoutMs: 120_000,
        idleTimeoutMs: 60_000,
        onIdle: "pause",
        metadata: { run: "7" },
        limits: { memoryMiB: 768, cpus: 0.5, pids: 64, diskMiB: 256, lifetimeMs: 600_000 },
      }),
      /no VMs here/,
    );
    assert.deepEqual(bodies, [
      {
        snapshot_tag: "py",
        n: 1,
        deadline_ms: 120_000,
        timeout_ms: 60_000,
        metadata: { run: "7" },
        on_idle: "pause",
        limits: { memory_mib: 768, cpus: 0.5, pids: 64, disk_mib: 256, lifetime_ms: 600_000 },
      },
    ]);
  } finally {
    await new Promise((r) => server.close(r));
  }
});
