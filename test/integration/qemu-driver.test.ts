/**
 * The QEMU driver's contract, on real QEMU: cold boot, device-state save, restore into a new
 * process, pause/resume, adoption by another driver instance (a restarted daemon), kill and
 * exit detection, and fast, clean failure when QEMU refuses to start.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentClient } from "../../src/agent/client.js";
import { createOverlay } from "../../src/disk/overlay.js";
import { chooseAccel } from "../../src/host/accel.js";
import { REPO_DIR, defaultPaths } from "../../src/host/paths.js";
import { findJailer } from "../../src/host/native.js";
import { findQemu } from "../../src/host/qemu-binary.js";
import { ImageBuilder } from "../../src/image/builder.js";
import type { GuestImage } from "../../src/image/builder.js";
import { ForkdError } from "../../src/util/errors.js";
import { sha256File } from "../../src/snapshot/meta.js";
import { isAlive } from "../../src/util/proc.js";
import { defaultCpu, kernelCmdline, vmFiles } from "../../src/vmm/config.js";
import type { MachineConfig } from "../../src/vmm/config.js";
import { QemuDriver } from "../../src/vmm/qemu.js";
import type { QemuVm } from "../../src/vmm/qemu.js";

let dir: string;
let image: GuestImage;
let driver: QemuDriver;
let machine: MachineConfig;
let tscKhz: number;
const vms: QemuVm[] = [];

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "forkd-driver-"));
  const accel = await chooseAccel(await findQemu());
  tscKhz = accel.tscKhz;
  driver = new QemuDriver(await findQemu(process.env, accel.accel), { jailer: await findJailer() });
  machine = { memoryMiB: 256, vcpus: 1, accel: accel.accel, cpu: defaultCpu(accel.accel) };
  image = await new ImageBuilder(REPO_DIR, defaultPaths().cacheDir).ensure("python");
});

after(async () => {
  await Promise.all(vms.map((vm) => vm.kill().catch(() => undefined)));
  await rm(dir, { recursive: true, force: true });
});

/** A child of the parent saved by the second test: own disk layer, state loaded, still paused. */
async function startChild(name: string): Promise<{ vm: QemuVm; agent: AgentClient }> {
  const childDir = join(dir, name);
  await mkdir(childDir, { recursive: true });
  await createOverlay(join(childDir, "disk.qcow2"), {
    backing: join(dir, "parent", "disk.qcow2"),
    backingFormat: "qcow2",
  });
  const vm = await driver.launch({
    dir: childDir,
    machine,
    memory: { path: join(dir, "memory"), mode: "child" },
    disk: join(childDir, "disk.qcow2"),
    incoming: true,
  });
  vms.push(vm);
  const agent = await AgentClient.connect(vmFiles(childDir).agent, 5_000);
  await vm.restoreState(join(dir, "vmstate"));
  return { vm, agent };
}

async function waitPing(agent: AgentClient, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await agent.ping(2_000);
      return;
    } catch (e) {
      if (Date.now() > deadline) throw e;
    }
  }
}

test("QEMU refusing to start fails launch at its exit (not a timeout), with QEMU's own words", async () => {
  const d = join(dir, "bad");
  await mkdir(d);
  await assert.rejects(
    driver.launch({
      dir: d,
      machine,
      memory: { path: join(dir, "no/such/dir/memory"), mode: "child" },
      disk: join(dir, "no-such-disk.qcow2"),
      incoming: true,
    }),
    (e: unknown) =>
      e instanceof ForkdError &&
      e.code === "vmm_error" &&
      !/timed out/.test(e.message) &&
      /Could not open .*no-such-disk\.qcow2/.test(e.message),
  );
});

test("boot, save device state, restore in a new process, pause/resume, adopt, kill", async () => {
  const parentDir = join(dir, "parent");
  const childDir = join(dir, "child");
  await mkdir(parentDir);
  await mkdir(childDir);
  const memory = join(dir, "memory");
  const vmstate = join(dir, "vmstate");
  await createOverlay(join(parentDir, "disk.qcow2"), { backing: image.rootfs, backingFormat: "raw" });

  const parent = await driver.launch({
    dir: parentDir,
    machine,
    memory: { path: memory, mode: "parent" },
    disk: join(parentDir, "disk.qcow2"),
    boot: { kernel: image.kernel, initrd: image.initrd, append: kernelCmdline(machine.accel, tscKhz) },
  });
  vms.push(parent);
  assert.equal(await parent.status(), "running");
  // Started through the jailer: the same pid is QEMU itself, with huge pages off.
  const status = await readFile(`/proc/${parent.pid}/status`, "utf8");
  assert.match(status, /^THP_enabled:\s+0$/m);
  assert.match(await readFile(`/proc/${parent.pid}/comm`, "utf8"), /^(qemu-system|forkd-vm)/);
  const pa = await AgentClient.connect(vmFiles(parentDir).agent, 5_000);
  await waitPing(pa, 180_000);
  await pa.writeFile("/root/marker", Buffer.from("parent-state"));
  await pa.sync();
  await parent.saveState(vmstate);
  assert.equal(await parent.status(), "postmigrate");
  await parent.stop();
  pa.close();
  assert.equal(parent.exited, true);
  assert.equal(isAlive(parent.pid), false);
  assert.equal((await stat(memory)).size, machine.memoryMiB << 20);

  const { vm: child, agent: ca } = await startChild("child");
  assert.equal(await child.status(), "paused");
  await child.resume();
  assert.equal((await ca.readFile("/root/marker")).toString(), "parent-state");
  await child.pause();
  assert.equal(await child.status(), "paused");
  await child.resume();
  assert.equal(await child.status(), "running");

  // Another driver instance (a restarted daemon) adopts the running child...
  const other = new QemuDriver(driver.binary);
  assert.equal(await other.adopt({ pid: child.pid, startTime: child.id.startTime + 1 }, childDir), null);
  child.qmp.close(); // one QMP client at a time
  const adopted = await other.adopt(child.id, childDir);
  assert.ok(adopted);
  vms.push(adopted);
  assert.equal(await adopted.status(), "running");
  assert.equal((await ca.ping()).version, 1);
  // ...and sees it die.
  process.kill(child.pid, "SIGKILL");
  await adopted.waitExit(10_000);
  assert.equal(adopted.exited, true);
  ca.close();
  assert.ok(existsSync(memory), "the memory image must outlive its users");
});

test("a child maps the memory image privately: the file is unchanged by the child's writes", async () => {
  const memory = join(dir, "memory");
  const before = await sha256File(memory);
  const { vm, agent } = await startChild("child2");
  await vm.resume();
  // Dirty ~50 MB of guest RAM (tmpfs), then check the image.
  const r = await agent.exec({ shell: "head -c 50000000 /dev/zero | tr '\\0' x > /dev/shm/fill && echo ok" })
    .result;
  assert.equal(r.exitCode, 0);
  agent.close();
  await vm.kill();
  assert.equal((await sha256File(memory)).sha256, before.sha256);
});
