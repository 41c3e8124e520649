/**
 * One fake VMM process: what QEMU would hold (run state, disk layers, NIC, forwards, the agent
 * channel, its guest) with no emulation. State files are small JSON naming the guest, so a
 * paused VM's guest (its files, its processes) comes back in the VM that loads its state.
 */
import { EventEmitter } from "node:events";
import { access, appendFile, readFile, stat, writeFile } from "node:fs/promises";
import { ForkdError } from "../../src/util/errors.js";
import type { VmLaunch } from "../../src/vmm/config.js";
import type { ExitVerdict, VmIdentity } from "../../src/vmm/vm.js";
import { AgentPort } from "./agent-port.js";
import type { Faults } from "./faults.js";
import { FakeGuest } from "./guest.js";

export interface StateFile {
  fake: "forkd-fake-vm";
  kind: "full" | "devices";
  guest: string;
}

/** What the fake host keeps across VMs: guests frozen in saved state, the faults, the options. */
export interface FakeWorld {
  faults: Faults;
  python: boolean;
  /** Guests are light (in this process, answering only what a sandbox's life needs: guest.ts). */
  light: boolean;
  /** Guests of VMs that saved their state and ended before running again, by name. */
  frozen: Map<string, FakeGuest>;
  gone(p: FakeVmmProcess): void;
}

export class FakeVmmProcess extends EventEmitter {
  status: string;
  exited = false;
  verdict: ExitVerdict = { oomKilled: false, memoryLimitMiB: null };
  readonly port: AgentPort;
  guest: FakeGuest | null = null;
  /** Set by a save, cleared when the guest runs again: its state lives on in that file. */
  private savedGuest = false;
  linkUp: boolean | null;
  readonly forwards = new Set<string>();
  top: string;
  readonly layers: string[];
  private threshold: { node: string; offset: number } | null = null;
  private nodeSeq = 0;

  constructor(
    readonly id: VmIdentity,
    readonly launch: VmLaunch,
    private readonly world: FakeWorld,
  ) {
    super();
    this.setMaxListeners(0);
    this.port = new AgentPort(`fake-vm-${id.pid}`);
    this.status = launch.incoming ? "inmigrate" : "running";
    this.linkUp = launch.nic ? true : null;
    this.top = launch.disk;
    this.layers = [launch.disk];
  }

  get dir(): string {
    return this.launch.dir;
  }

  get topNode(): string {
    return `#block${this.nodeSeq}`;
  }

  /** Cold boot: a fresh guest runs at once. */
  async boot(silent: boolean): Promise<void> {
    this.setGuest(await FakeGuest.start({ python: this.world.python, silent, light: this.world.light }));
    this.port.setRunning(true);
  }

  private setGuest(g: FakeGuest): void {
    this.guest = g;
    this.port.attach(g);
  }

  private alive(): void {
    if (this.exited) throw new ForkdError("unavailable", `fake VMM ${this.id.pid} has exited`);
  }

  async restore(file: string, silent: boolean): Promise<void> {
    this.alive();
    if (this.status !== "inmigrate")
      throw new ForkdError("vmm_error", `loading device state: the VM is ${this.status}, not waiting for it`);
    let raw: string;
    try {
      raw = await readFile(file, "utf8");
    } catch (e) {
      throw new ForkdError("vmm_error", `loading device state failed: ${String(e)}`);
    }
    let saved: StateFile | null = null;
    try {
      const j = JSON.parse(raw) as Partial<StateFile>;
      if (j.fake === "forkd-fake-vm") saved = j as StateFile;
    } catch {
      /* another VMM's state (a fake snapshot's): a fresh guest */
    }
    // A silent guest stands in even for a frozen one (which stays frozen for a later restore).
    const frozen = saved?.kind === "devices" && !silent ? this.world.frozen.get(saved.guest) : undefined;
    if (frozen) this.world.frozen.delete(frozen.name);
    this.setGuest(
      frozen ?? (await FakeGuest.start({ python: this.world.python, silent, light: this.world.light })),
    );
    this.guest?.freeze();
    this.status = "paused";
  }

  pause(): void {
    this.alive();
    if (this.status === "running") {
      this.guest?.freeze();
      this.port.setRunning(false);
      this.status = "paused";
    }
  }

  resume(): void {
    this.alive();
    if (this.status === "inmigrate" || this.status === "postmigrate")
      throw new ForkdError("vmm_error", `cannot resume a VM in state ${this.status}`);
    this.status = "running";
    this.savedGuest = false;
    this.guest?.thaw();
    this.port.setRunning(true);
  }

  async save(file: string, kind: StateFile["kind"]): Promise<void> {
    this.alive();
    if (kind === "full") this.pause();
    const state: StateFile = { fake: "forkd-fake-vm", kind, guest: this.guest?.name ?? "" };
    await writeFile(file, JSON.stringify(state));
    this.savedGuest = true;
    if (kind === "full") this.status = "postmigrate";
  }

  async freezeDisk(newTop: string): Promise<string> {
    this.alive();
    try {
      await access(newTop);
    } catch {
      throw new ForkdError("vmm_error", `Could not open '${newTop}': No such file or directory`);
    }
    const old = this.top;
    this.top = newTop;
    this.layers.push(newTop);
    this.nodeSeq++;
    this.threshold = null;
    return old;
  }

  setWriteThreshold(node: string, offset: number): void {
    this.alive();
    if (node !== this.topNode) throw new ForkdError("vmm_error", `no node ${node}`);
    this.threshold = { node, offset };
  }

  /** The guest writes `bytes` to its disk (appended to the top layer's file). */
  async writeDisk(bytes: number): Promise<void> {
    await appendFile(this.top, Buffer.alloc(bytes, 0x5a));
    const t = this.threshold;
    if (t && (await stat(this.top)).size > t.offset) {
      this.threshold = null;
      this.emit("threshold");
    }
  }

  /** The process ends (asked or not): its guest goes with it, unless its state was saved. */
  async end(verdict?: ExitVerdict): Promise<void> {
    if (this.exited) return;
    this.exited = true;
    if (verdict) this.verdict = verdict;
    this.status = "exited";
    const g = this.guest;
    this.guest = null;
    this.port.close();
    if (g && this.savedGuest) this.world.frozen.set(g.name, g);
    else await g?.kill();
    this.world.gone(this);
    this.emit("exit");
  }

  /** The VMM dies by itself (a crash; `oom`: its cgroup's memory limit). */
  crash(oom?: { memoryLimitMiB: number }): Promise<void> {
    return this.end(oom ? { oomKilled: true, memoryLimitMiB: oom.memoryLimitMiB } : undefined);
  }
}
