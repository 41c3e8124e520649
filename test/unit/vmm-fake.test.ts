/**
 * The VMM contract (test/contract/vmm.ts) on the fake VMM (test/fakes/vmm.ts), so the unit tests
 * that use the fake stand on what QEMU does (the same cases run on QEMU in
 * test/integration/qemu-driver.test.ts); and the fake's own guarantees: faults fire as injected,
 * and a paused VM's guest comes back in the VM that loads its device state.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { ForkdError } from "../../src/util/errors.js";
import { vmmContract } from "../contract/vmm.js";
import { FakeHost } from "../fakes/vmm.js";

const dir = await mkdtemp(join(tmpdir(), "forkd-fakevmm-"));
const host = new FakeHost();
await writeFile(join(dir, "rootfs"), Buffer.alloc(1 << 20));
await mkdir(join(dir, "scratch"));
const contract = vmmContract({
  dir,
  driver: host.driver(),
  restarted: () => host.driver(),
  machine: { memoryMiB: 128, vcpus: 1, accel: "tcg", cpu: "qemu64" },
  boot: { kernel: "/nonexistent/vmlinuz", initrd: "/nonexistent/initrd", append: "" },
  rootfs: join(dir, "rootfs"),
  guestScratch: join(dir, "scratch"),
  bootTimeoutMs: 10_000,
  killFromOutside: (vm) => void host.process(vm.pid)?.crash(),
});

after(async () => {
  await contract.cleanup();
  await host.close();
  await rm(dir, { recursive: true, force: true });
});

for (const c of contract.cases) test(`contract (fake): ${c.name}`, c.fn);

test("fake: an injected fault fails the call it names, once, with vmm_error", async () => {
  const d = join(dir, "faults");
  await mkdir(d);
  await writeFile(join(d, "disk"), "");
  const launch = {
    dir: d,
    machine: { memoryMiB: 128, vcpus: 1, accel: "tcg" as const, cpu: "qemu64" },
    memory: { path: join(d, "memory"), mode: "parent" as const },
    disk: join(d, "disk"),
  };
  const driver = host.driver();
  host.inject("launch", { fail: "no room" });
  await assert.rejects(
    driver.launch(launch),
    (e: unknown) => e instanceof ForkdError && e.code === "vmm_error" && /no room/.test(e.message),
  );
  const vm = await driver.launch(launch);
  host.inject("pause", { fail: "stuck", pid: vm.pid });
  await assert.rejects(vm.pause(), /stuck/);
  assert.equal(await vm.status(), "running", "a failed pause leaves it running");
  await vm.pause();
  assert.equal(await vm.status(), "paused");
  await vm.kill();
});

test("fake: a paused VM's guest (its files) comes back in the VM that loads its device state", async () => {
  const d = join(dir, "continuity");
  await mkdir(d);
  await writeFile(join(d, "disk"), "");
  const machine = { memoryMiB: 128, vcpus: 1, accel: "tcg" as const, cpu: "qemu64" };
  const driver = host.driver();
  const a = await driver.launch({
    dir: d,
    machine,
    memory: { path: join(d, "memory"), mode: "parent" },
    disk: join(d, "disk"),
  });
  const agent = await a.connectAgent(1_000);
  await agent.ping(5_000);
  const guest = host.process(a.pid)?.guest;
  assert.ok(guest);
  await agent.writeFile(join(guest.dir, "kept"), Buffer.from("yes"));
  await a.pause();
  await a.saveDevicesState(join(d, "state"));
  agent.close();
  await a.stop();
  const b = await driver.launch({
    dir: d,
    machine,
    memory: { path: join(d, "memory"), mode: "child" },
    disk: join(d, "disk"),
    incoming: true,
  });
  const again = await b.connectAgent(1_000);
  await b.restoreState(join(d, "state"));
  await b.resume();
  assert.equal((await again.readFile(join(guest.dir, "kept"))).toString(), "yes");
  assert.equal(host.process(b.pid)?.guest, guest);
  again.close();
  await b.kill();
});

test("fake: IDENTITY is answered by the fake VM and recorded, never run by the agent on the host", async () => {
  const d = join(dir, "identity");
  await mkdir(d);
  await writeFile(join(d, "disk"), "");
  const machine = { memoryMiB: 128, vcpus: 1, accel: "tcg" as const, cpu: "qemu64" };
  const vm = await host
    .driver()
    .launch({ dir: d, machine, memory: { path: join(d, "memory"), mode: "parent" }, disk: join(d, "disk") });
  const agent = await vm.connectAgent(1_000);
  const name = hostname();
  await agent.identity(
    { hostname: "forkd-fake-must-not-rename-the-host", sandboxId: "sb-abcdefghijklmnop" },
    5_000,
  );
  assert.equal(hostname(), name);
  assert.deepEqual(host.process(vm.pid)?.guest?.identities, [
    { hostname: "forkd-fake-must-not-rename-the-host", sandboxId: "sb-abcdefghijklmnop" },
  ]);
  assert.equal((await agent.ping(5_000)).version, 1, "the agent still answers after it");
  agent.close();
  await vm.kill();
});
