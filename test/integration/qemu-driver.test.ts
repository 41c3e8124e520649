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
import { createOverlay, rawSize } from "../../src/disk/overlay.js";
import { chooseAccel } from "../../src/vmm/accel.js";
import { REPO_DIR, defaultPaths } from "../../src/host/paths.js";
import { findJailer, findMemsnap } from "../../src/host/native.js";
import { findQemu } from "../../src/vmm/qemu-binary.js";
import { ImageBuilder } from "../../src/image/builder.js";
import { GUEST_NET } from "../../src/net/guest.js";
import { sha256File } from "../../src/snapshot/meta.js";
import { defaultCpu, kernelCmdline } from "../../src/vmm/config.js";
import { forkdLiveCapture } from "../../src/vmm/live-capture.js";
import { forkdMemsnap } from "../../src/vmm/memsnap.js";
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
    sizeBytes: await rawSize(image.rootfs),
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

/** A guest process rewriting `mib` MiB with a new byte value each round, a chunk every few ms. */
const WRITER = (mib: number) => `
import time
n = ${mib} << 20
chunk = 256 << 10
b = bytearray(n)
mv = memoryview(b)
i = 0
while True:
    i += 1
    pat = bytes([i % 251 + 1]) * chunk
    for off in range(0, n, chunk):
        mv[off:off + chunk] = pat
        time.sleep(0.003)
    open("/root/rounds", "w").write(str(i))
`;

/** The diff files' pages, by offset: the file offset of the first page that differs, or null. */
async function firstDifference(a: string, b: string): Promise<string | null> {
  const [x, y] = await Promise.all([readFile(a), readFile(b)]);
  if (x.length !== y.length) return `sizes ${x.length} and ${y.length}`;
  for (let off = 0; off < x.length; off += 4096) {
    if (!x.subarray(off, off + 4096).equals(y.subarray(off, off + 4096))) return `at byte ${off}`;
  }
  return null;
}

/** Runs `cmd` in the guest; its stdout. */
async function guestSh(agent: AgentClient, cmd: string): Promise<string> {
  let out = "";
  const r = await agent.exec({ shell: cmd }, { onStdout: (c) => void (out += c.toString("utf8")) }).result;
  assert.equal(r.exitCode, 0, `${cmd}: exit ${String(r.exitCode)}`);
  return out;
}

test("a live capture (QEMU's precopy into forkd-memsnap live) holds exactly the pages of its instant, page by page", async () => {
  const memsnap = await findMemsnap();
  const memory = join(dir, "memory");
  const { vm, agent } = await startChild("child-live");
  await vm.resume();
  await guestSh(
    agent,
    `cat > /root/w.py <<'EOF'\n${WRITER(48)}\nEOF\nnohup python3 /root/w.py >/dev/null 2>&1 &`,
  );
  // Until the writer has made its whole buffer private once.
  const deadline = Date.now() + 120_000;
  while (!(await guestSh(agent, "cat /root/rounds 2>/dev/null || true")).trim()) {
    assert.ok(Date.now() < deadline, "the writer did not finish a round");
    await new Promise((r) => setTimeout(r, 200));
  }
  const liveDiff = join(dir, "live.diff");
  const stoppedDiff = join(dir, "stopped.diff");
  const live = await forkdLiveCapture(memsnap).start(vm, memory, liveDiff);
  try {
    // The guest writes on while QEMU sends its RAM; the instant is QEMU's stop at the switchover.
    await live.stopped();
    assert.notEqual(await vm.status(), "running");
    // The same instant, copied as a stopped branch does (the guest is still stopped).
    const stopped = await forkdMemsnap(memsnap).capture(vm.pid, memory, stoppedDiff);
    const copied = await stopped.go();
    await stopped.written;
    const stats = await live.go();
    await vm.resume();
    await live.written;
    assert.ok(copied.bytes >= 48 << 20, `the writer's pages are private (${copied.bytes} bytes)`);
    assert.equal(stats.pages, copied.pages);
    assert.equal(await firstDifference(liveDiff, stoppedDiff), null);
  } finally {
    await live.abort();
  }
  // The source runs on, and a second live capture works on it (the migration state was reset).
  assert.equal(await vm.status(), "running");
  const rounds = Number(await guestSh(agent, "cat /root/rounds"));
  assert.ok(rounds >= 1);
  const again = await forkdLiveCapture(memsnap).start(vm, memory, join(dir, "live2.diff"));
  await again.stopped();
  await again.go();
  await vm.resume();
  await again.written;
  await agent.ping(10_000);
  agent.close();
  await vm.kill();
});
