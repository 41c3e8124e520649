/**
 * A sandbox's record always fits what a restarted daemon reads: the largest metadata, env and
 * network lists either API accepts make a record that is written and read back, a record over
 * the bound is never written, and a pause clears the deadline in the same record write.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { z } from "zod";
import { CreateSandboxes } from "../../src/api/contract/schemas.js";
import { Metadata, NetworkConfig, NewSandbox } from "../../src/e2b/control/schemas.js";
import { loadRecord, saveRecord } from "../../src/sandbox/record.js";
import { pausedRecord } from "../../src/sandbox/recovery.js";
import type { PausedImage, SandboxRecord } from "../../src/sandbox/sandbox.js";
import { ForkdError } from "../../src/util/errors.js";

const ID = "sb-aaaaaaaaaaaaaaaa";

/** The largest `make(n)` that `schema` accepts, n in [0, max] (binary search). */
function largest<T>(schema: z.ZodType, max: number, make: (n: number) => T): T {
  let lo = 0;
  let hi = max;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (schema.safeParse(make(mid)).success) lo = mid;
    else hi = mid - 1;
  }
  assert.ok(schema.safeParse(make(lo)).success);
  return make(lo);
}

// Characters JSON escapes (6 each) where a schema counts raw length.
const esc = (n: number) => "\u0001".repeat(n);
const keys = (n: number, len: number) => Array.from({ length: n }, (_, i) => `${i}`.padStart(len, "k"));

function record(dir: string, over: Partial<SandboxRecord> = {}): SandboxRecord {
  return {
    format: 1,
    id: ID,
    tag: "base",
    pid: 1,
    pidStartTime: 1,
    created: new Date().toISOString(),
    timings: { launchMs: 1, restoreMs: 1, readyMs: 1, totalMs: 3 },
    fromPool: false,
    timeoutMs: null,
    metadata: {},
    onIdle: "kill",
    owner: "tenant-with-a-long-name-0123456789",
    memoryFile: join(dir, "paused-x", "memory"),
    ...over,
  };
}

test("the largest metadata, env and network either API accepts make a record recovery reads back", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-record-"));
  try {
    // E2B's metadata (64 keys of 256, values up to 4096) and forkd's env (256 variables of 64 KiB).
    const metaKeys = keys(64, 256);
    const metadata = largest(Metadata, 4096, (n) => Object.fromEntries(metaKeys.map((k) => [k, esc(n)])));
    const envKeys = keys(128, 255).map((k) => `V${k}`);
    const env = largest(CreateSandboxes, 1 << 16, (n) => ({
      snapshot_tag: "base",
      env: Object.fromEntries(envKeys.map((k) => [k, esc(n)])),
    })).env;
    const lists = largest(NetworkConfig, 256, (n) => ({
      allowOut: Array.from({ length: 256 }, () => esc(n)),
      denyOut: Array.from({ length: 256 }, () => esc(n)),
    }));
    const r = record(dir, {
      metadata,
      env,
      network: {
        mode: "netns",
        egress: {
          mode: "list",
          allow: Array.from({ length: 64 }, (_, i) => ({
            cidr: `203.0.${i}.0/24`,
            ports: Array.from({ length: 32 }, (_, j): [number, number] => [10000 + j, 65535]),
          })),
          dns: true,
        },
        expose: Array.from({ length: 16 }, (_, i) => 60000 + i),
        guestIp: "10.0.2.15",
        slot: 12345,
        ports: Object.fromEntries(
          Array.from({ length: 16 }, (_, i) => [`${60000 + i}`, `127.0.0.1:${40000 + i}`]),
        ),
      },
      deadline: new Date().toISOString(),
      onDeadline: "pause",
      e2b: {
        secure: true,
        autoResume: true,
        timeoutMs: 1000,
        allowInternetAccess: false,
        network: { allowOut: lists.allowOut, denyOut: lists.denyOut },
      },
    });
    await saveRecord(dir, r);
    const back = await loadRecord(dir, ID);
    assert.equal(back.kind, "ok", back.kind === "corrupt" ? back.reason : "");
    assert.deepEqual(back.kind === "ok" ? back.record.metadata : null, metadata);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("over the bounds: a 400 naming the field, in both APIs", () => {
  const big = (n: number, len: number) =>
    Object.fromEntries(keys(n, 8).map((k) => [`V${k}`, "x".repeat(len)]));
  const forkd = CreateSandboxes.safeParse({ snapshot_tag: "base", env: big(20, 4000) });
  assert.ok(!forkd.success && forkd.error.issues.some((i) => i.path[0] === "env"));
  const e2bMeta = NewSandbox.safeParse({ templateID: "base", metadata: big(64, 4096) });
  assert.ok(!e2bMeta.success && e2bMeta.error.issues.some((i) => i.path[0] === "metadata"));
  const e2bNet = NewSandbox.safeParse({
    templateID: "base",
    network: { allowOut: Array.from({ length: 256 }, () => "a".repeat(256)) },
  });
  assert.ok(!e2bNet.success && e2bNet.error.issues.some((i) => i.path.join(".") === "network.allowOut"));
});

test("a record recovery would refuse is never written", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-record-"));
  try {
    const r = record(dir, { metadata: { big: "x".repeat(300 << 10) } });
    await assert.rejects(
      saveRecord(dir, r),
      (e: unknown) => e instanceof ForkdError && e.code === "payload_too_large",
    );
    assert.deepEqual(await readdir(dir), []);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("a pause clears the deadline in the paused record itself (no second write to lose)", () => {
  const dir = "/data/sandboxes/sb-aaaaaaaaaaaaaaaa";
  const image: PausedImage = {
    pausedAt: new Date().toISOString(),
    memory: `${dir}/paused-1/memory`,
    vmstate: `${dir}/paused-1/vmstate`,
    disk: `${dir}/disk.qcow2`,
    machine: { memoryMiB: 512, vcpus: 1, accel: "tcg", cpu: "max" },
    nic: undefined,
    pending: { diff: `${dir}/paused-1/memory.diff`, base: "/base/memory" },
  };
  const past = new Date(Date.now() - 60_000).toISOString();
  const p = pausedRecord(record(dir, { deadline: past, onDeadline: "kill" }), image);
  assert.equal(p.deadline, null);
  assert.equal(p.paused?.memory, image.memory);
  assert.equal(p.paused && "pending" in p.paused, false);
});
