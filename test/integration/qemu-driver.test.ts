/**
 * The VMM contract (test/contract/vmm.ts) on real QEMU: launch failure, cold boot, state saved
 * and restored into a new process, pause/resume, disk layers, adoption by another driver
 * instance (a restarted daemon), kill and exit detection. The same cases run on the fake VMM in
 * test/unit/vmm-fake.test.ts. Then what only QEMU has: the jailer's process policy, and a child
 * mapping the memory image privately.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AgentClient } from "../../src/agent/client.js";
import { createOverlay } from "../../src/disk/overlay.js";
import { chooseAccel } from "../../src/host/accel.js";
import { REPO_DIR, defaultPaths } from "../../src/host/paths.js";
import { findJailer } from "../../src/host/native.js";
import { findQemu } from "../../src/host/qemu-binary.js";
import { ImageBuilder } from "../../src/image/builder.js";
import { GUEST_NET } from "../../src/net/guest.js";
import { sha256File } from "../../src/snapshot/meta.js";
import { defaultCpu, kernelCmdline } from "../../src/vmm/config.js";
import { QemuDriver } from "../../src/vmm/qemu.js";
import type { QemuVm } from "../../src/vmm/qemu.js";
import { vmmContract } from "../contract/vmm.js";

const dir = await mkdtemp(join(tmpdir(), "forkd-driver-"));
const accel = await chooseAccel(await findQemu());
const driver = new QemuDriver(await findQemu(process.env, accel.accel), { jailer: await findJailer() });
const machine = { memoryMiB: 256, vcpus: 1, accel: accel.accel, cpu: defaultCpu(accel.accel) };
const vms: QemuVm[] = [];
let image: Awaited<ReturnType<ImageBuilder["ensure"]>>;

before(async () => {
  image = await new ImageBuilder(REPO_DIR, defaultPaths().cacheDir).ensure("python");
});

const contract = vmmContract({
  dir,
  driver,
  restarted: () => new QemuDriver(driver.binary),
  machine,
  get boot() {
    return { kernel: image.kernel, initrd: image.initrd, append: kernelCmdline(machine.accel, accel.tscKhz) };
  },
  get rootfs() {
    return image.rootfs;
  },
  guestScratch: "/root",
  bootTimeoutMs: 180_000,
  killFromOutside: (vm) => process.kill(vm.pid, "SIGKILL"),
});

after(async () => {
  await contract.cleanup();
  await Promise.all(vms.map((vm) => vm.kill().catch(() => undefined)));
  await rm(dir, { recursive: true, force: true });
});

for (const c of contract.cases) test(`contract (QEMU): ${c.name}`, c.fn);

/** A child of the parent the contract saved: own disk layer, state loaded, still paused. */
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
    nic: { guest: GUEST_NET, backend: { kind: "none" } },
  });
  vms.push(vm);
  const agent = await vm.connectAgent(5_000);
  await vm.restoreState(join(dir, "vmstate"));
  return { vm, agent };
}

test("QEMU starts through the jailer (same pid, huge pages off); a child maps the memory image privately", async () => {
  const memory = join(dir, "memory");
  const before = await sha256File(memory);
  const { vm, agent } = await startChild("child-private");
  const status = await readFile(`/proc/${vm.pid}/status`, "utf8");
  assert.match(status, /^THP_enabled:\s+0$/m);
  assert.match(await readFile(`/proc/${vm.pid}/comm`, "utf8"), /^(qemu-system|forkd-vm)/);
  await vm.resume();
  // Dirty ~50 MB of guest RAM (tmpfs), then check the image.
  const r = await agent.exec({ shell: "head -c 50000000 /dev/zero | tr '\\0' x > /dev/shm/fill && echo ok" })
    .result;
  assert.equal(r.exitCode, 0);
  agent.close();
  await vm.kill();
  assert.equal((await sha256File(memory)).sha256, before.sha256);
});
