/**
 * A fake VMM behind the same contract as QEMU (src/vmm/driver.ts, vm.ts; test/contract/vmm.ts):
 * for unit tests of what sits above it, with faults injected at will. No emulation: a "VM" is
 * its state in this process, and its guest is the real guest agent run on the host
 * (guest.ts), so exec, files and eval work for real. A FakeHost is the machine: its VMM
 * processes outlive a driver (a restarted daemon takes a new driver and adopts them).
 */
import { access, writeFile } from "node:fs/promises";
import type { AgentClient } from "../../src/agent/client.js";
import { ForkdError } from "../../src/util/errors.js";
import { vmFiles } from "../../src/vmm/config.js";
import type { VmLaunch } from "../../src/vmm/config.js";
import type { LaunchOptions, VmmDriver } from "../../src/vmm/driver.js";
import type { MemoryDiffs } from "../../src/vmm/memsnap.js";
import type { ExitVerdict, Vm, VmIdentity } from "../../src/vmm/vm.js";
import { Faults } from "./faults.js";
import type { FakeOp, Fault } from "./faults.js";
import type { FakeGuest } from "./guest.js";
import { fakeMemory } from "./memory.js";
import { FakeVmmProcess } from "./vmm-process.js";
import type { FakeWorld } from "./vmm-process.js";

/** Fake pids lie above Linux's largest pid_max: never a real process. */
const FIRST_PID = 1 << 23;

export class FakeHost {
  readonly faults = new Faults();
  private readonly procs = new Map<number, FakeVmmProcess>();
  private readonly frozen = new Map<string, FakeGuest>();
  private nextPid = FIRST_PID;
  private readonly world: FakeWorld;
  /** Private-page capture and apply for these VMMs (pause and BRANCH). */
  readonly memory: MemoryDiffs;

  /** `light`: guests run no agent process (guest.ts): for benchmarks of thousands of sandboxes. */
  constructor(o: { python?: boolean; light?: boolean } = {}) {
    this.world = {
      faults: this.faults,
      python: o.python ?? false,
      light: o.light ?? false,
      frozen: this.frozen,
      gone: (p) => this.procs.delete(p.id.pid),
    };
    this.memory = fakeMemory(this);
  }

  /** A driver (each daemon has its own; all see this host's processes). */
  driver(): FakeDriver {
    return new FakeDriver(this);
  }

  inject(op: FakeOp, f: Fault = {}): void {
    this.faults.inject(op, f);
  }

  /** Running VMM processes. */
  processes(): FakeVmmProcess[] {
    return [...this.procs.values()];
  }

  process(pid: number): FakeVmmProcess | undefined {
    return this.procs.get(pid);
  }

  /** Starts a VMM process (FakeDriver.launch). */
  async spawn(l: VmLaunch): Promise<FakeVmmProcess> {
    const f = await this.faults.hit("launch", null);
    // What QEMU opens at start: its directory, its disk, a child's memory file.
    for (const path of [l.dir, l.disk, ...(l.memory.mode === "child" ? [l.memory.path] : [])]) {
      try {
        await access(path);
      } catch {
        throw new ForkdError("vmm_error", `fake VMM did not come up: Could not open '${path}'`);
      }
    }
    if (l.memory.mode === "parent") await writeFile(l.memory.path, Buffer.alloc(4096));
    const pid = this.nextPid++;
    const p = new FakeVmmProcess({ pid, startTime: pid * 7 }, l, this.world);
    this.procs.set(pid, p);
    if (!l.incoming) await p.boot(f?.silentGuest ?? false);
    return p;
  }

  /** Kills every VMM and every frozen guest. */
  async close(): Promise<void> {
    await Promise.all(this.processes().map((p) => p.end()));
    await Promise.all([...this.frozen.values()].map((g) => g.kill()));
    this.frozen.clear();
  }
}

export class FakeDriver implements VmmDriver {
  readonly binary = "/nonexistent/forkd-fake-vmm";

  constructor(readonly host: FakeHost) {}

  async launch(l: VmLaunch, _opts: LaunchOptions = {}): Promise<FakeVm> {
    return new FakeVm(await this.host.spawn(l), this.host.faults);
  }

  async adopt(id: VmIdentity, dir: string): Promise<FakeVm | null> {
    await this.host.faults.hit("adopt", id.pid);
    const p = this.host.process(id.pid);
    if (!p || p.exited || p.id.startTime !== id.startTime || p.dir !== dir) return null;
    return new FakeVm(p, this.host.faults);
  }

  consoleTail(_dir: string, _bytes: number): Promise<string> {
    return Promise.resolve("");
  }
}

/** A daemon's handle on a fake VMM process (what QemuVm is with its QMP connection). */
export class FakeVm implements Vm {
  private detached = false;
  /** What this handle's holder asked to hear of the process's end (dropped by detach()). */
  private readonly exitFns: Array<() => void> = [];
  readonly released: Promise<ExitVerdict>;
  readonly owner = null;

  constructor(
    readonly proc: FakeVmmProcess,
    private readonly faults: Faults,
  ) {
    this.released = new Promise((resolve) => this.onExit(() => resolve(proc.verdict)));
  }

  get id(): VmIdentity {
    return this.proc.id;
  }

  get pid(): number {
    return this.proc.id.pid;
  }

  get dir(): string {
    return this.proc.dir;
  }

  get exited(): boolean {
    return this.proc.exited;
  }

  onExit(fn: () => void): void {
    if (this.proc.exited) fn();
    else if (!this.detached) {
      this.exitFns.push(fn);
      this.proc.once("exit", fn);
    }
  }

  waitExit(timeoutMs: number): Promise<void> {
    if (this.proc.exited) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const t = setTimeout(
        () => reject(new ForkdError("timeout", `VM ${this.pid} did not exit in ${timeoutMs} ms`)),
        timeoutMs,
      );
      this.onExit(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  /** A control command: its fault first; refused once detached or exited (QMP is closed). */
  private async control(op: FakeOp | null): Promise<FakeVmmProcess> {
    if (this.detached) throw new ForkdError("unavailable", "fake VMM control connection closed");
    if (op) await this.faults.hit(op, this.pid);
    if (this.proc.exited) throw new ForkdError("unavailable", "fake VMM control connection closed");
    return this.proc;
  }

  async connectAgent(_timeoutMs: number): Promise<AgentClient> {
    await this.faults.hit("connectAgent", this.pid);
    if (this.proc.exited)
      throw new ForkdError("unavailable", `agent socket ${vmFiles(this.dir).agent}: gone`);
    return this.proc.port.connect();
  }

  /** Its daemon is gone: nothing it held hears of the VMM again. */
  detach(): void {
    this.detached = true;
    for (const fn of this.exitFns.splice(0)) this.proc.off("exit", fn);
    for (const fn of this.thresholdFns.splice(0)) this.proc.off("threshold", fn);
  }

  async status(): Promise<string> {
    return (await this.control(null)).status;
  }

  async pause(): Promise<void> {
    (await this.control("pause")).pause();
  }

  async resume(): Promise<void> {
    (await this.control("resume")).resume();
  }

  async saveState(file: string, _timeoutMs?: number): Promise<void> {
    await (await this.control("saveState")).save(file, "full");
  }

  async saveDevicesState(file: string): Promise<void> {
    await (await this.control("saveDevicesState")).save(file, "devices");
  }

  async restoreState(file: string, _timeoutMs?: number): Promise<void> {
    if (this.detached) throw new ForkdError("unavailable", "fake VMM control connection closed");
    const f = await this.faults.hit("restore", this.pid);
    await this.proc.restore(file, f?.silentGuest ?? false);
  }

  /** The live RAM migration: none, or stopped at its switchover, or done (no data is sent). */
  private migration: { phase: "stopped" | "done"; wasRunning: boolean } | null = null;

  async migrateRam(uri: string): Promise<void> {
    if (!/^unix:\//.test(uri)) throw new ForkdError("internal", `bad migration uri ${uri}`);
    const p = await this.control("migrateRam");
    if (this.migration?.phase === "stopped") throw new ForkdError("vmm_error", "a migration is in progress");
    this.migration = { phase: "stopped", wasRunning: p.status === "running" };
    p.pause();
  }

  async migrationStopped(_timeoutMs: number): Promise<void> {
    await this.control(null);
    if (this.migration?.phase !== "stopped")
      throw new ForkdError("vmm_error", "no migration stopped at its switchover");
  }

  async migrationFinish(_timeoutMs: number): Promise<void> {
    await this.control("migrationFinish");
    if (this.migration?.phase !== "stopped")
      throw new ForkdError("vmm_error", "no migration stopped at its switchover");
    this.migration.phase = "done";
  }

  async migrationCancel(_timeoutMs: number): Promise<void> {
    const p = await this.control(null);
    const m = this.migration;
    this.migration = null;
    if (m?.phase === "stopped" && m.wasRunning) p.resume();
  }

  async diskTop(): Promise<string> {
    return (await this.control(null)).top;
  }

  async diskLayers(): Promise<{ top: string; topNode: string; files: string[] }> {
    const p = await this.control(null);
    return { top: p.top, topNode: p.topNode, files: [...p.layers] };
  }

  async freezeDisk(newTop: string): Promise<string> {
    return (await this.control("freezeDisk")).freezeDisk(newTop);
  }

  async setWriteThreshold(node: string, offset: number): Promise<void> {
    (await this.control(null)).setWriteThreshold(node, offset);
  }

  private readonly thresholdFns: Array<() => void> = [];

  onDiskWriteThreshold(fn: () => void): void {
    this.thresholdFns.push(fn);
    this.proc.on("threshold", fn);
  }

  async setLink(up: boolean): Promise<void> {
    (await this.control("setLink")).linkUp = up;
  }

  async hostfwdAdd(rule: string): Promise<void> {
    if (!/^tcp:[0-9.]+:\d+-[0-9.]+:\d+$/.test(rule)) throw new ForkdError("internal", `bad forward ${rule}`);
    (await this.control(null)).forwards.add(rule);
  }

  async hostfwdRemove(rule: string): Promise<void> {
    if (!/^tcp:[0-9.]+:\d+$/.test(rule)) throw new ForkdError("internal", `bad forward ${rule}`);
    const p = await this.control(null);
    for (const r of p.forwards) if (r.startsWith(`${rule}-`)) p.forwards.delete(r);
  }

  async stop(_graceMs?: number): Promise<void> {
    if (this.proc.exited) return;
    await this.faults.hit("stop", this.pid);
    await this.proc.end();
  }

  async kill(): Promise<void> {
    await this.proc.end();
  }
}
