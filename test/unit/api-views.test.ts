/** Wire views of the sandbox service's domain objects: every field the schema names, valid by it. */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { z } from "zod";
import * as schemas from "../../src/api/contract/schemas.js";
import { commandView } from "../../src/api/views/command.js";
import { networkView } from "../../src/api/views/network.js";
import { sandboxView } from "../../src/api/views/sandbox.js";
import type { CommandHandle } from "../../src/sandbox/commands/table.js";
import type { NetworkRecord } from "../../src/net/service.js";
import { CommandTap } from "../../src/sandbox/commands/tap.js";
import { newSandbox } from "../../src/sandbox/sandbox.js";
import type { Sandbox, SandboxRecord } from "../../src/sandbox/sandbox.js";

const record: SandboxRecord = {
  format: 1,
  id: "sb-aaaaaaaaaaaaaaab",
  tag: "base",
  pid: 4242,
  pidStartTime: 1,
  created: "2026-01-01T00:00:00.000Z",
  timings: { launchMs: 1, restoreMs: 2, readyMs: 3, totalMs: 6 },
  fromPool: true,
  timeoutMs: 60_000,
  metadata: { k: "v" },
  onIdle: "kill",
  owner: "alice",
  limits: { memoryMiB: 896, cpus: 0.5, pids: 1024, diskMiB: null, lifetimeMs: 3_600_000 },
  network: {
    mode: "netns",
    egress: {
      mode: "list",
      allow: [
        {
          cidr: "203.0.113.0/24",
          ports: [
            [80, 80],
            [8000, 8100],
          ],
        },
      ],
      dns: false,
    },
    expose: [8080, 22],
    guestIp: "10.0.2.15",
    slot: 3,
    ports: { "8080": "127.0.0.1:40001", "22": "127.0.0.1:40000" },
  },
};

const sandbox = (over: Partial<Sandbox> = {}): Sandbox => ({
  ...newSandbox(record, "/nonexistent", null, null, null),
  lastUsed: Date.parse("2026-01-01T00:01:00.000Z"),
  ...over,
});

/** Parses `v` with `schema` made strict: no field the contract does not name, none missing. */
function assertExactly(schema: z.ZodObject, v: unknown): void {
  schema.strict().parse(v);
}

test("a running sandbox's view: every Sandbox field, its deadlines, its network with ports sorted", () => {
  const v = sandboxView(sandbox());
  assertExactly(schemas.Sandbox, v);
  assert.equal(v.id, record.id);
  assert.equal(v.from_pool, true);
  assert.equal(v.owner, "alice");
  assert.equal(v.expires_at, "2026-01-01T00:02:00.000Z"); // last use + idle timeout
  assert.equal(v.ends_at, "2026-01-01T01:00:00.000Z"); // created + lifetime
  assert.deepEqual(v.limits, {
    memory_mib: 896,
    cpus: 0.5,
    pids: 1024,
    disk_mib: null,
    lifetime_ms: 3_600_000,
  });
  assert.deepEqual(v.network, {
    mode: "netns",
    guest_ip: "10.0.2.15",
    egress: { mode: "list", allow: [{ cidr: "203.0.113.0/24", ports: [80, "8000-8100"] }], dns: false },
    ports: [
      { port: 22, host: "127.0.0.1:40000" },
      { port: 8080, host: "127.0.0.1:40001" },
    ],
  });
});

test("a paused or exited sandbox shows no host ports and no idle deadline; its exit reason", () => {
  const paused = sandboxView(sandbox({ state: "paused" }));
  assertExactly(schemas.Sandbox, paused);
  assert.deepEqual(paused.network.ports, []);
  assert.equal(paused.expires_at, null);
  const exited = sandboxView(sandbox({ state: "exited", exitReason: "idle timeout" }));
  assert.equal(exited.exit_reason, "idle timeout");
  assert.equal(exited.state, "exited");
});

test("a record from before limits, metadata and networking reads as their defaults", () => {
  const { limits: _l, metadata: _m, network: _n, timeoutMs: _t, owner: _o, ...old } = record;
  const v = sandboxView(sandbox({ record: old }));
  assertExactly(schemas.Sandbox, v);
  assert.deepEqual(v.metadata, {});
  assert.equal(v.owner, null);
  assert.equal(v.timeout_ms, null);
  assert.equal(v.ends_at, null);
  assert.deepEqual(v.network, { mode: "none", guest_ip: null, egress: null, ports: [] });
});

test("network mode none shows no egress policy", () => {
  const none: NetworkRecord = {
    mode: "none",
    egress: { mode: "deny", allow: [], dns: false },
    expose: [],
    guestIp: null,
    slot: null,
    ports: {},
  };
  const v = networkView(none, true);
  schemas.SandboxNetwork.strict().parse(v);
  assert.equal(v.egress, null);
});

test("a running command's view", () => {
  const handle = {} as CommandHandle;
  const v = commandView({
    pid: 7,
    cmd: ["sleep", "9"],
    started: "2026-01-01T00:00:00.000Z",
    stdinOpen: true,
    pty: false,
    door: "envd",
    tag: "t",
    handle,
    tap: new CommandTap(),
  });
  assertExactly(schemas.Command, v);
  assert.deepEqual(v, {
    pid: 7,
    cmd: ["sleep", "9"],
    started: "2026-01-01T00:00:00.000Z",
    stdin_open: true,
    pty: false,
    source: "envd",
    tag: "t",
  });
});
