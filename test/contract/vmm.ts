/**
 * The VMM contract (src/vmm/driver.ts, vm.ts): what the sandbox and snapshot services rely on,
 * as cases every implementation runs (Hono's routers: one shared case file, one runner per
 * implementation). Runners: test/unit/vmm-fake.test.ts (the fake), and
 * test/integration/qemu-driver.test.ts (QEMU, under TCG here). The cases run in order and share
 * one cold-booted parent, whose saved state the later ones restore children from.
 */
import assert from "node:assert/strict";
import { mkdir, stat } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import type { AgentClient } from "../../src/agent/client.js";
import { createOverlay, rawSize } from "../../src/disk/overlay.js";
import { GUEST_NET } from "../../src/net/guest.js";
import { ForkdError } from "../../src/util/errors.js";
import type { MachineConfig, VmLaunch } from "../../src/vmm/config.js";
import type { VmmDriver } from "../../src/vmm/driver.js";
import type { Vm } from "../../src/vmm/vm.js";

export interface VmmFixture {
  /** A scratch directory for the cases' files. */
  dir: string;
  driver: VmmDriver;
  /** Another driver instance, as a restarted daemon has. */
  restarted(): VmmDriver;
  machine: MachineConfig;
  /** What a parent boots (kernel, initrd, command line) and its root file system. */
  boot: NonNullable<VmLaunch["boot"]>;
  rootfs: string;
  /** A directory the guest's commands may write (the fake's guests run on the host). */
  guestScratch: string;
  /** How long the guest may take to boot (TCG is slow). */
  bootTimeoutMs: number;
  /** Kills the VMM process from outside (SIGKILL, the OOM killer, a crash). */
  killFromOutside(vm: Vm): void;
}

export interface ContractCase {
  name: string;
  fn: () => Promise<void>;
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

export function vmmContract(fx: VmmFixture): { cases: ContractCase[]; cleanup: () => Promise<void> } {
  const vms: Vm[] = [];
  const agents: AgentClient[] = [];
  const memory = join(fx.dir, "memory");
  const vmstate = join(fx.dir, "vmstate");
  const parentDisk = join(fx.dir, "parent", "disk.qcow2");
  const nic = { guest: GUEST_NET, backend: { kind: "none" as const } };
  let saved = false;

  const track = <T extends Vm>(vm: T): T => {
    vms.push(vm);
    return vm;
  };
  const connect = async (vm: Vm, ms = 10_000): Promise<AgentClient> => {
    const a = await vm.connectAgent(ms);
    agents.push(a);
    return a;
  };

  /** A child of the saved parent: its own disk layer, state loaded, still paused. */
  async function child(name: string): Promise<{ vm: Vm; agent: AgentClient; launch: VmLaunch }> {
    assert.ok(saved, "the parent's state is saved by an earlier case");
    const d = join(fx.dir, name);
    await mkdir(d, { recursive: true });
    const disk = join(d, "disk.qcow2");
    await createOverlay(disk, {
      backing: parentDisk,
      backingFormat: "qcow2",
      sizeBytes: await rawSize(fx.rootfs),
    });
    const launch: VmLaunch = {
      dir: d,
      machine: fx.machine,
      memory: { path: memory, mode: "child" },
      disk,
      incoming: true,
      nic,
    };
    const vm = track(await fx.driver.launch(launch));
    assert.equal(await vm.status(), "inmigrate");
    // Connected before the state loads: the guest never sees its host end closed.
    const agent = await connect(vm);
    await vm.restoreState(vmstate);
    return { vm, agent, launch };
  }

  const cases: ContractCase[] = [
    {
      name: "a VMM that cannot start fails launch with vmm_error naming what it could not open",
      async fn() {
        const d = join(fx.dir, "bad");
        await mkdir(d, { recursive: true });
        await assert.rejects(
          fx.driver.launch({
            dir: d,
            machine: fx.machine,
            memory: { path: join(fx.dir, "no/such/dir/memory"), mode: "child" },
            disk: join(fx.dir, "no-such-disk.qcow2"),
            incoming: true,
          }),
          (e: unknown) =>
            e instanceof ForkdError &&
            e.code === "vmm_error" &&
            !/timed out/.test(e.message) &&
            /Could not open .*no-such-(disk\.qcow2|dir)/.test(e.message),
        );
      },
    },
    {
      name: "cold boot: the guest's agent answers; saveState leaves it postmigrate; stop ends the process",
      async fn() {
        const d = join(fx.dir, "parent");
        await mkdir(d, { recursive: true });
        await createOverlay(parentDisk, {
          backing: fx.rootfs,
          backingFormat: "raw",
          sizeBytes: await rawSize(fx.rootfs),
        });
        const parent = track(
          await fx.driver.launch({
            dir: d,
            machine: fx.machine,
            memory: { path: memory, mode: "parent" },
            disk: parentDisk,
            boot: fx.boot,
            nic,
          }),
        );
        assert.equal(parent.dir, d);
        assert.ok(Number.isInteger(parent.pid) && parent.pid > 0);
        assert.equal(parent.id.pid, parent.pid);
        assert.equal(await parent.status(), "running");
        assert.equal(await parent.diskTop(), parentDisk);
        const agent = await connect(parent);
        await waitPing(agent, fx.bootTimeoutMs);
        await agent.writeFile(`${fx.guestScratch}/marker`, Buffer.from("parent-state"));
        await agent.sync();
        await parent.setLink(false);
        await parent.saveState(vmstate);
        assert.equal(await parent.status(), "postmigrate");
        let exits = 0;
        parent.onExit(() => exits++);
        await parent.stop();
        agent.close();
        assert.equal(parent.exited, true);
        assert.equal(exits, 1, "onExit ran once");
        parent.onExit(() => exits++);
        assert.equal(exits, 2, "onExit on an exited VM runs at once");
        await parent.waitExit(1_000);
        assert.deepEqual(await parent.released, { oomKilled: false, memoryLimitMiB: null });
        assert.ok((await stat(memory)).size > 0, "the memory file is the parent's RAM");
        saved = true;
      },
    },
    {
      name: "restore: a child loads the parent's state paused, runs on resume, pauses and resumes",
      async fn() {
        const { vm, agent } = await child("child");
        assert.equal(await vm.status(), "paused");
        // A paused guest answers nothing until it runs.
        await assert.rejects(
          agent.ping(300),
          (e: unknown) => e instanceof ForkdError && e.code === "timeout",
        );
        await vm.resume();
        assert.equal(await vm.status(), "running");
        await waitPing(agent, 30_000);
        assert.equal((await agent.readFile(`${fx.guestScratch}/marker`)).toString(), "parent-state");
        await vm.pause();
        assert.equal(await vm.status(), "paused");
        await vm.resume();
        assert.equal(await vm.status(), "running");
        await agent.ping(10_000);
        await vm.setLink(true);
      },
    },
    {
      name: "live RAM migration: stops the guest at the switchover, finishes there; a cancelled one resumes it",
      async fn() {
        const { vm, agent, launch } = await child("child-migrate");
        await vm.resume();
        await waitPing(agent, 30_000);
        // A reader that takes the stream and drops it (forkd-memsnap live parses it: live-capture.ts).
        const sock = join(launch.dir, "m.sock");
        const server = createServer((c) => c.resume());
        await new Promise<void>((resolve) => server.listen(sock, resolve));
        try {
          await assert.rejects(vm.migrateRam("file:/x"), (e: unknown) => e instanceof ForkdError);
          await vm.migrateRam(`unix:${sock}`);
          await vm.migrationStopped(60_000);
          assert.notEqual(await vm.status(), "running");
          await vm.migrationFinish(60_000);
          assert.notEqual(await vm.status(), "running");
          await vm.resume();
          await vm.migrationCancel(10_000); // none in progress: resets, no error
          assert.equal(await vm.status(), "running");
          await agent.ping(10_000);
          // Cancelled at the switchover: the guest runs again without a resume.
          await vm.migrateRam(`unix:${sock}`);
          await vm.migrationStopped(60_000);
          await vm.migrationCancel(10_000);
          assert.equal(await vm.status(), "running");
          await agent.ping(10_000);
          // A plain pause and resume still work after it.
          await vm.pause();
          await vm.resume();
          await agent.ping(10_000);
        } finally {
          server.close();
        }
        await vm.kill();
      },
    },
    {
      name: "restoring state into a VM not waiting for it, or from a missing file, fails",
      async fn() {
        const { vm } = await child("child-twice");
        await assert.rejects(vm.restoreState(vmstate, 5_000));
        const d = join(fx.dir, "child-nofile");
        await mkdir(d, { recursive: true });
        const disk = join(d, "disk.qcow2");
        await createOverlay(disk, {
          backing: parentDisk,
          backingFormat: "qcow2",
          sizeBytes: await rawSize(fx.rootfs),
        });
        const other = track(
          await fx.driver.launch({
            dir: d,
            machine: fx.machine,
            memory: { path: memory, mode: "child" },
            disk,
            incoming: true,
            nic,
          }),
        );
        await assert.rejects(other.restoreState(join(fx.dir, "no-such-state"), 5_000));
        await other.kill();
        await vm.kill();
      },
    },
    {
      name: "disk: freezing the top layer sends writes to the new one; layers and threshold",
      async fn() {
        const { vm, launch } = await child("child-disk");
        const newTop = join(launch.dir, "disk-2.qcow2");
        await createOverlay(newTop, {
          backing: launch.disk,
          backingFormat: "qcow2",
          sizeBytes: 1 << 30,
        });
        assert.equal(await vm.diskTop(), launch.disk);
        assert.equal(await vm.freezeDisk(newTop), launch.disk);
        assert.equal(await vm.diskTop(), newTop);
        const layers = await vm.diskLayers();
        assert.equal(layers.top, newTop);
        assert.ok(
          layers.files.includes(newTop) && layers.files.includes(launch.disk),
          JSON.stringify(layers),
        );
        await vm.setWriteThreshold(layers.topNode, 1 << 30);
        await vm.saveDevicesState(join(launch.dir, "devices"));
        assert.ok((await stat(join(launch.dir, "devices"))).size > 0);
        await vm.resume();
        await vm.kill();
      },
    },
    {
      name: "adopt: another driver takes over a running VM by identity (not a reused pid) and sees it die",
      async fn() {
        const { vm, agent, launch } = await child("child-adopt");
        await vm.resume();
        await waitPing(agent, 30_000);
        const other = fx.restarted();
        assert.equal(await other.adopt({ pid: vm.pid, startTime: vm.id.startTime + 1 }, launch.dir), null);
        vm.detach(); // the old daemon is gone: one control connection at a time
        agent.close();
        const adopted = await other.adopt(vm.id, launch.dir);
        assert.ok(adopted);
        track(adopted);
        assert.equal(adopted.pid, vm.pid);
        assert.equal(await adopted.status(), "running");
        const again = await connect(adopted);
        await waitPing(again, 10_000);
        fx.killFromOutside(adopted);
        await adopted.waitExit(10_000);
        assert.equal(adopted.exited, true);
        assert.equal(await other.adopt(vm.id, launch.dir), null, "a VM that is gone is not adopted");
      },
    },
    {
      name: "kill: the process ends, its agent connection closes, exit waiters run",
      async fn() {
        const { vm, agent } = await child("child-kill");
        await vm.resume();
        await waitPing(agent, 30_000);
        let exited = false;
        vm.onExit(() => (exited = true));
        await vm.kill();
        assert.equal(vm.exited, true);
        assert.equal(exited, true);
        await assert.rejects(agent.ping(5_000), (e: unknown) => e instanceof ForkdError);
        await assert.rejects(vm.status());
        await vm.kill(); // idempotent
        await vm.stop();
      },
    },
  ];
  return {
    cases,
    async cleanup() {
      for (const a of agents) a.close();
      await Promise.all(vms.map((vm) => vm.kill().catch(() => undefined)));
    },
  };
}
