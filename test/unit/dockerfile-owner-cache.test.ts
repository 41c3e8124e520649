/**
 * Whose the Dockerfile step cache is, and what the build VM is started with (no VM: a driver
 * that records the launch and refuses it): step keys are the owner's (the same Dockerfile has
 * other keys for another tenant and for the admins); a build by tenant B never finds tenant A's
 * layers (its progress says nothing cached, it boots its own VM) while A's rebuild finds them
 * all; the build VM is jailed, with its RAM and the layers it writes in its own directory under
 * run/ (not the shared cache), its base image and cached layers read-only, and cgroup limits.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { GuestImage } from "../../src/image/builder.js";
import { buildDockerfile } from "../../src/image/dockerfile/build.js";
import type { DockerfileDeps } from "../../src/image/dockerfile/build.js";
import { cacheScope, stepKeys } from "../../src/image/dockerfile/keys.js";
import { parseDockerfile } from "../../src/image/dockerfile/parse.js";
import { EMPTY_CONFIG, plan } from "../../src/image/dockerfile/plan.js";
import { StepCache } from "../../src/image/dockerfile/step-cache.js";
import { ForkdError } from "../../src/util/errors.js";
import type { VmLaunch } from "../../src/vmm/config.js";
import type { VmmDriver } from "../../src/vmm/driver.js";
import { JailedTools } from "../../src/vmm/jailed-tools.js";

const DOCKERFILE = "FROM forkd://python\nRUN head -c 16 /dev/urandom | od -An -tx1 > /secret\nRUN echo two\n";

let dir: string;
let base: GuestImage;
let launches: VmLaunch[];
let deps: DockerfileDeps;

/** A driver that records each launch and refuses it (nothing here boots). */
const recording = (): VmmDriver => ({
  binary: "/bin/false",
  launch: (l) => {
    launches.push(l);
    return Promise.reject(new ForkdError("vmm_error", "no VM in this test"));
  },
  adopt: () => Promise.resolve(null),
  consoleTail: () => Promise.resolve(""),
});

const keysOf = (owner: string | null) =>
  stepKeys(owner, base.content, plan(parseDockerfile(DOCKERFILE), EMPTY_CONFIG), () => "");

async function build(owner: string | null): Promise<{ messages: string[]; error: unknown }> {
  const messages: string[] = [];
  const ctx = join(dir, "ctx");
  await mkdir(ctx, { recursive: true });
  try {
    await buildDockerfile(deps, { dockerfile: DOCKERFILE, contextDir: ctx, owner }, (m) => messages.push(m));
    return { messages, error: null };
  } catch (e) {
    return { messages, error: e };
  }
}

/** A real qcow2 layer over the base's rootfs, committed to the cache as `key`. */
async function commitLayer(cache: StepCache, key: string): Promise<void> {
  const work = await cache.workDir();
  const file = join(work, "layer.qcow2");
  execFileSync("qemu-img", ["create", "-q", "-f", "qcow2", "-b", base.rootfs, "-F", "raw", file]);
  await cache.commit(key, file, { line: 2 });
  await rm(work, { recursive: true, force: true });
}

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "forkd-df-owner-"));
  const img = join(dir, "cache", "images", "base");
  await mkdir(img, { recursive: true });
  for (const f of ["vmlinuz", "initrd.img"]) await writeFile(join(img, f), f);
  await writeFile(join(img, "rootfs.ext4"), "");
  await truncate(join(img, "rootfs.ext4"), 16 << 20);
  base = {
    hash: "h".repeat(64),
    content: "c".repeat(64),
    dir: img,
    template: "python",
    kernel: join(img, "vmlinuz"),
    initrd: join(img, "initrd.img"),
    rootfs: join(img, "rootfs.ext4"),
    kernelVersion: "6.1",
  };
  deps = {
    cacheDir: join(dir, "cache"),
    driver: recording(),
    accel: { accel: "tcg", forced: true, reason: "test", tscKhz: 1 },
    runDir: join(dir, "data", "run"),
    // The recording driver's VM writes no layer: no tool runs on one (plain runner).
    tools: new JailedTools(null, null),
    resolve: () =>
      Promise.resolve({ image: base, config: EMPTY_CONFIG, source: { kind: "template", name: "python" } }),
  };
  await mkdir(deps.runDir, { recursive: true });
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

test("step keys are the owner's: another tenant's and the admins' differ at every step", () => {
  const alice = keysOf("alice");
  assert.deepEqual(keysOf("alice"), alice, "the same owner, the same keys");
  const all = [alice, keysOf("bob"), keysOf(null), keysOf("admin")];
  for (const [i, k] of all.entries())
    for (const o of all.slice(i + 1)) {
      for (const [j, key] of k.steps.entries()) assert.notEqual(key, o.steps[j]);
      assert.notEqual(k.final, o.final);
    }
  assert.notEqual(cacheScope(null), cacheScope("admin"), "a tenant named admin is not the admins");
});

test("tenant B's build never finds tenant A's layers; A's rebuild finds every one", async () => {
  // Tenant A built this Dockerfile before: every step and its image are in the cache.
  const cache = new StepCache(deps.cacheDir);
  const a = keysOf("alice");
  for (const key of [...a.steps, a.final]) await commitLayer(cache, key);
  const address = "d".repeat(64);
  await mkdir(join(cache.imagesDir(), address), { recursive: true });
  await writeFile(join(cache.imagesDir(), address, "manifest.json"), "{}");
  await cache.setResult(a.final, address);

  launches = [];
  const again = await build("alice");
  assert.equal(again.error, null, String(again.error));
  assert.equal(again.messages.filter((m) => m.endsWith(": cached")).length, 3, again.messages.join("\n"));
  assert.equal(launches.length, 0, "nothing to run");

  for (const owner of ["bob", null]) {
    launches = [];
    const other = await build(owner);
    assert.ok(other.error instanceof ForkdError && other.error.code === "vmm_error", String(other.error));
    assert.ok(!other.messages.some((m) => /cached/.test(m)), other.messages.join("\n"));
    assert.equal(launches.length, 1, `${String(owner)} boots a build VM of its own`);
    // It boots on the base image, not on one of A's layers.
    assert.deepEqual(launches[0]?.jail?.reads, [base.dir]);
  }
});

test("the build VM is jailed: its RAM and layers in its own directory under run/, reads read-only, cgroup limits", async () => {
  // Bob built the first step before: the VM boots on his cached layer.
  const cache = new StepCache(deps.cacheDir);
  const b = keysOf("bob");
  await commitLayer(cache, b.steps[0] ?? "");
  launches = [];
  const r = await build("bob");
  assert.ok(r.error instanceof ForkdError, String(r.error));
  assert.ok(
    r.messages.some((m) => m === "step 1/3: RUN head -c 16 /dev/urandom | od -An -tx1 > /secret: cached"),
  );
  const l = launches[0];
  assert.ok(l?.jail, "launched jailed");
  assert.equal(dirname(l.dir), deps.runDir, "its own directory, under run/");
  for (const f of [l.memory.path, l.disk]) {
    assert.equal(dirname(f), l.dir, `${f} is in its own directory`);
    assert.ok(!f.startsWith(deps.cacheDir + "/"), `${f} is not in the shared cache`);
  }
  assert.deepEqual(l.jail.reads, [base.dir, dirname(cache.layer(b.steps[0] ?? ""))]);
  assert.deepEqual(l.jail.limits, { memoryMiB: 512 + 384, pids: 256, cpus: 1 });
  // Nothing is left of it.
  assert.deepEqual(execFileSync("ls", ["-A", deps.runDir]).toString(), "");
});
