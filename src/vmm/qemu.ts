/**
 * QEMU processes: launch (cold boot or restore), adopt after a daemon restart, pause, resume,
 * save device state, stop. A VM process outlives the daemon (its own session, stdio to a file),
 * so a daemon restart re-adopts it instead of killing it. QemuDriver and QemuVm are the daemon's
 * VmmDriver and Vm (driver.ts, vm.ts).
 */
import { spawn } from "node:child_process";
import { open } from "node:fs/promises";
import { AgentClient } from "../agent/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { childEnv, isAlive, processCmdline, processStartTime } from "../util/index.js";
import { sleep } from "../util/index.js";
import { NETDEV_ID, qemuArgs, vmFiles } from "./config.js";
import type { VmLaunch } from "./config.js";
import { QmpClient } from "./qmp.js";
import type { QmpEvent } from "./qmp.js";
import type { Jail } from "./jail.js";
import { readFileTail } from "../util/index.js";
import type { LaunchOptions, VmmDriver } from "./driver.js";
import type { ExitVerdict, Vm, VmIdentity } from "./vm.js";
import { chown, readFile, rename, rm } from "node:fs/promises";
import { basename, join } from "node:path";

/** Live RAM migration (migrateRam): bandwidth uncapped (bytes/s), and the stopped pass's budget. */
const LIVE_MAX_BANDWIDTH = 64 * 1024 ** 3;
const LIVE_DOWNTIME_MS = 5;
const LIVE_MAX_DOWNTIME_MS = 80;
const LIVE_RAISE_EVERY_MS = 2_000;
const MIGRATION_ENDED = new Set(["completed", "failed", "cancelled"]);

export class QemuVm implements Vm {
  private exitWaiters: Array<() => void> = [];
  private hasExited = false;
  /** Names this VM's temporary device-state files apart. */
  private saveSeq = 0;
  /**
   * Resolves once the process is gone and its jail released (uid, cgroup): with the cgroup's
   * verdict on why it died. Set by the driver.
   */
  released: Promise<ExitVerdict> = Promise.resolve({ oomKilled: false, memoryLimitMiB: null });
  /** The jailed VMM's uid and gid: files it must open (a new disk layer) are given to it. */
  owner: { uid: number; gid: number } | null = null;

  constructor(
    readonly id: VmIdentity,
    readonly dir: string,
    readonly qmp: QmpClient,
    private readonly owned: boolean,
  ) {
    if (!owned) void this.watchForeignExit();
  }

  get pid(): number {
    return this.id.pid;
  }

  get exited(): boolean {
    return this.hasExited;
  }

  /** Called by the driver when an owned child exits. */
  markExited(): void {
    if (this.hasExited) return;
    this.hasExited = true;
    this.qmp.close();
    for (const w of this.exitWaiters.splice(0)) w();
  }

  private async watchForeignExit(): Promise<void> {
    while (!this.hasExited) {
      if ((await processStartTime(this.id.pid)) !== this.id.startTime) {
        this.markExited();
        return;
      }
      await sleep(this.qmp.closed ? 50 : 500);
    }
  }

  /** Calls `fn` once when the process exits (at once if it already has). */
  onExit(fn: () => void): void {
    if (this.hasExited) fn();
    else this.exitWaiters.push(fn);
  }

  /** Resolves when the process has exited, or rejects after `timeoutMs`. */
  waitExit(timeoutMs: number): Promise<void> {
    if (this.hasExited) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const t = setTimeout(
        () => reject(new ForkdError("timeout", `VM ${this.pid} did not exit in ${timeoutMs} ms`)),
        timeoutMs,
      );
      this.exitWaiters.push(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  connectAgent(timeoutMs: number, signal?: AbortSignal): Promise<AgentClient> {
    return AgentClient.connect(vmFiles(this.dir).agent, timeoutMs, signal, { handover: true });
  }

  detach(): void {
    this.qmp.close();
  }

  async resume(): Promise<void> {
    await this.qmp.execute("cont");
  }

  async pause(): Promise<void> {
    await this.qmp.execute("stop");
  }

  /** The file of the disk's current top layer. */
  async diskTop(): Promise<string> {
    const blocks =
      await this.qmp.execute<Array<{ device: string; inserted?: { file: string } }>>("query-block");
    const top = blocks.find((b) => b.device === "d0")?.inserted?.file;
    if (!top) throw new ForkdError("vmm_error", "the VM has no disk d0");
    return top;
  }

  /**
   * The disk's layers: the top one's file and the name of its file (protocol) node, and the files
   * of every qcow2 layer (top, its own earlier layers, the snapshot's).
   */
  async diskLayers(): Promise<{ top: string; topNode: string; files: string[] }> {
    const top = await this.diskTop();
    const nodes = await this.qmp.execute<Array<{ "node-name": string; drv: string; file: string }>>(
      "query-named-block-nodes",
      { flat: true },
    );
    const node = nodes.find((n) => n.drv === "file" && n.file === top);
    if (!node) throw new ForkdError("vmm_error", `the disk's top layer ${top} has no file node`);
    const files = [...new Set(nodes.filter((n) => n.drv === "qcow2").map((n) => n.file))];
    return { top, topNode: node["node-name"], files };
  }

  /**
   * Arms QEMU's write threshold on a file node (diskLayers().topNode): the first write that
   * reaches past `offset` bytes of that file raises BLOCK_WRITE_THRESHOLD (once per arming; see
   * onDiskWriteThreshold). qcow2 allocates new clusters at the file's end, so the offset bounds
   * what the layer holds.
   */
  async setWriteThreshold(node: string, offset: number): Promise<void> {
    await this.qmp.execute("block-set-write-threshold", { "node-name": node, "write-threshold": offset });
  }

  /** Calls `fn` whenever a write crosses the threshold set by setDiskWriteThreshold. */
  onDiskWriteThreshold(fn: () => void): void {
    this.qmp.on("event", (e: QmpEvent) => {
      if (e.event === "BLOCK_WRITE_THRESHOLD") fn();
    });
  }

  /**
   * Freezes the disk's current top layer (paused VM): writes go to `newTop`, an existing empty
   * qcow2 layer whose backing file is the current top, which becomes read-only. Returns the old
   * top's path.
   */
  async freezeDisk(newTop: string): Promise<string> {
    const top = await this.diskTop();
    await this.qmp.execute(
      "blockdev-snapshot-sync",
      { device: "d0", "snapshot-file": newTop, format: "qcow2", mode: "existing" },
      30_000,
    );
    return top;
  }

  /**
   * Writes the device state without RAM (paused VM). Loaded by a VM started with
   * `devicesOnlyState`; RAM comes from a memory image built separately.
   */
  async saveDevicesState(file: string): Promise<void> {
    // A jailed VMM sees only its own directory: it writes there, and the daemon moves the file
    // (same file system) and takes it back from the VMM's uid.
    const tmp = join(this.dir, `.devices-${++this.saveSeq}`);
    try {
      await this.qmp.execute("xen-save-devices-state", { filename: tmp, live: false }, 30_000);
      if (this.owner) await chown(tmp, process.getuid?.() ?? 0, process.getgid?.() ?? 0);
      await rename(tmp, file);
    } finally {
      await rm(tmp, { force: true });
    }
  }

  /**
   * Loads device state saved by saveState() into a VM started with `incoming`, and returns once
   * it is loaded (the VM still paused). Nothing may be sent to the guest's devices before that:
   * data that reaches a half-loaded virtio queue is lost.
   */
  async restoreState(file: string, timeoutMs = 30_000): Promise<void> {
    await this.qmp.execute("migrate-set-capabilities", {
      capabilities: [
        { capability: "x-ignore-shared", state: true },
        { capability: "events", state: true },
      ],
    });
    const done = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        cleanup();
        reject(new ForkdError("timeout", `device state did not load within ${timeoutMs} ms`));
      }, timeoutMs);
      const onEvent = (e: QmpEvent) => {
        if (e.event !== "MIGRATION") return;
        const status = e.data?.status;
        if (status === "completed") {
          cleanup();
          resolve();
        } else if (status === "failed" || status === "cancelled") {
          cleanup();
          reject(new ForkdError("vmm_error", `loading device state ${String(status)}`));
        }
      };
      const onClose = (err: Error) => {
        cleanup();
        reject(err);
      };
      const cleanup = () => {
        clearTimeout(timer);
        this.qmp.off("event", onEvent);
        this.qmp.off("close", onClose);
      };
      this.qmp.on("event", onEvent);
      this.qmp.on("close", onClose);
    });
    done.catch(() => undefined);
    await this.qmp.execute("migrate-incoming", { uri: `file:${file}` });
    await done;
  }

  /**
   * Starts a live migration of RAM to `uri` that stops at the switchover (a live BRANCH,
   * live-capture.ts): precopy passes while the guest runs; once the rest fits in the downtime
   * limit QEMU stops the guest and waits (pause-before-switchover) for migrationFinish.
   * Uncapped bandwidth, a small downtime limit (so the last pass, sent while stopped, is small),
   * zero pages as 1-byte records, no RAM skipped (x-ignore-shared off: every page goes).
   */
  async migrateRam(uri: string): Promise<void> {
    if (!/^unix:\//.test(uri)) throw new ForkdError("internal", `bad migration uri ${uri}`);
    await this.qmp.execute("migrate-set-capabilities", {
      capabilities: [
        { capability: "x-ignore-shared", state: false },
        { capability: "pause-before-switchover", state: true },
        { capability: "events", state: true },
      ],
    });
    await this.qmp.execute("migrate-set-parameters", {
      "max-bandwidth": LIVE_MAX_BANDWIDTH,
      "downtime-limit": LIVE_DOWNTIME_MS,
      "zero-page-detection": "legacy",
    });
    await this.qmp.execute("migrate", { uri });
  }

  /**
   * Resolves once QEMU has stopped the guest at the switchover (status pre-switchover). QEMU
   * stops once the rest fits in the downtime limit at the bandwidth it measured; a guest that
   * dirties more than that per pass (or a host too loaded to send fast) never gets there, so the
   * limit doubles every LIVE_RAISE_EVERY_MS up to LIVE_MAX_DOWNTIME_MS: a longer last pass
   * rather than none.
   */
  async migrationStopped(timeoutMs: number): Promise<void> {
    let limit = LIVE_DOWNTIME_MS;
    const raise = setInterval(() => {
      if (limit >= LIVE_MAX_DOWNTIME_MS) return;
      limit = Math.min(limit * 2, LIVE_MAX_DOWNTIME_MS);
      this.qmp.execute("migrate-set-parameters", { "downtime-limit": limit }).catch(() => undefined);
    }, LIVE_RAISE_EVERY_MS);
    try {
      await this.migrationReaches("pre-switchover", timeoutMs);
    } finally {
      clearInterval(raise);
    }
  }

  /**
   * Sends the last pages and the device state; resolves once the migration completed and the VM
   * left `finish-migrate` (QEMU reports "completed" a moment before its run state moves on to
   * `postmigrate`, and refuses `cont` until then: "Migration is not finalized yet").
   */
  async migrationFinish(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    await this.qmp.execute("migrate-continue", { state: "pre-switchover" });
    await this.migrationReaches("completed", timeoutMs);
    for (let delay = 1; (await this.status()) === "finish-migrate"; delay = Math.min(delay * 2, 20)) {
      if (Date.now() > deadline)
        throw new ForkdError("timeout", `the VM did not leave finish-migrate within ${timeoutMs} ms`);
      await sleep(delay);
    }
  }

  /** Cancels a migration in progress (QEMU resumes a guest it stopped) and waits until it ended. */
  async migrationCancel(timeoutMs: number): Promise<void> {
    const st = await this.migrationStatus();
    if (st.status !== "none" && !MIGRATION_ENDED.has(st.status)) {
      await this.qmp.execute("migrate_cancel");
      const deadline = Date.now() + timeoutMs;
      for (
        let delay = 1;
        !MIGRATION_ENDED.has((await this.migrationStatus()).status);
        delay = Math.min(delay * 2, 50)
      ) {
        if (Date.now() > deadline)
          throw new ForkdError("timeout", "the migration did not end when cancelled");
        await sleep(delay);
      }
    }
    await this.qmp.execute("migrate-set-capabilities", {
      capabilities: [{ capability: "pause-before-switchover", state: false }],
    });
  }

  private async migrationStatus(): Promise<{ status: string; error?: string }> {
    const m = await this.qmp.execute<{ status?: string; "error-desc"?: string }>("query-migrate");
    return { status: m.status ?? "none", ...(m["error-desc"] ? { error: m["error-desc"] } : {}) };
  }

  /**
   * Waits for migration status `want`: on its MIGRATION event (events capability), polling
   * query-migrate as well in case the event came before the listener. Rejects if the migration
   * fails or is cancelled, if QMP closes, or after `timeoutMs`.
   */
  private async migrationReaches(want: string, timeoutMs: number): Promise<void> {
    let onEvent: ((e: QmpEvent) => void) | undefined;
    let timer: NodeJS.Timeout | undefined;
    let poll: NodeJS.Timeout | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        // Once settled (by an event, a poll or the timeout) no poll is scheduled again: a reply
        // in flight at that moment would otherwise start a poller nobody clears.
        let settled = false;
        const settle = (e?: Error) => {
          if (settled) return;
          settled = true;
          if (e) reject(e);
          else resolve();
        };
        const check = (status: string, error?: string) => {
          if (status === want) settle();
          else if (status === "failed" || status === "cancelled" || status === "completed")
            settle(new ForkdError("vmm_error", `migration ${status}${error ? `: ${error}` : ""}`));
        };
        onEvent = (e: QmpEvent) => {
          if (e.event === "MIGRATION" && typeof e.data?.status === "string") check(e.data.status);
        };
        this.qmp.on("event", onEvent);
        timer = setTimeout(
          () => settle(new ForkdError("timeout", `migration did not reach ${want} within ${timeoutMs} ms`)),
          timeoutMs,
        );
        const tick = () => {
          if (settled) return;
          this.migrationStatus().then(
            (m) => {
              check(m.status, m.error);
              if (!settled) poll = setTimeout(tick, 20);
            },
            (e: unknown) => settle(e instanceof Error ? e : new Error(String(e))),
          );
        };
        tick();
      });
    } finally {
      if (onEvent) this.qmp.off("event", onEvent);
      clearTimeout(timer);
      clearTimeout(poll);
    }
  }

  /**
   * Sets the guest NIC's link (carrier) up or down. On a paused VM the guest sees the change
   * when it runs.
   */
  async setLink(up: boolean): Promise<void> {
    await this.qmp.execute("set_link", { name: NETDEV_ID, up });
  }

  /** Removes a forward added by hostfwdAdd: `tcp:HOSTADDR:HOSTPORT`. */
  async hostfwdRemove(rule: string): Promise<void> {
    if (!/^tcp:[0-9.]+:\d+$/.test(rule)) throw new ForkdError("internal", `bad forward ${rule}`);
    const out = await this.qmp.execute<string>("human-monitor-command", {
      "command-line": `hostfwd_remove ${NETDEV_ID} ${rule}`,
    });
    // "... removed", or "... not found" (gone already: what was asked for).
    if (!/removed|not found/i.test(out) && out.trim() !== "")
      throw new ForkdError("unavailable", `cannot remove forward ${rule}: ${out.trim()}`);
  }

  /**
   * Adds a forward to the NIC's user-mode stack, e.g. `tcp:127.0.0.1:40000-10.0.2.15:8000` (HMP
   * `hostfwd_add`: QMP has no command for it). HMP reports failure as text.
   */
  async hostfwdAdd(rule: string): Promise<void> {
    if (!/^tcp:[0-9.]+:\d+-[0-9.]+:\d+$/.test(rule)) throw new ForkdError("internal", `bad forward ${rule}`);
    const out = await this.qmp.execute<string>("human-monitor-command", {
      "command-line": `hostfwd_add ${NETDEV_ID} ${rule}`,
    });
    if (out.trim() !== "") throw new ForkdError("unavailable", `cannot forward ${rule}: ${out.trim()}`);
  }

  async status(): Promise<string> {
    return (await this.qmp.execute<{ status: string }>("query-status")).status;
  }

  /**
   * Stops the VM and writes its device state (not its RAM: the RAM is the shared memory file)
   * to `file`. The VM must never run again on that memory file afterwards.
   */
  async saveState(file: string, timeoutMs = 60_000): Promise<void> {
    await this.qmp.execute("stop");
    await this.qmp.execute("migrate-set-capabilities", {
      capabilities: [
        { capability: "x-ignore-shared", state: true },
        // Left on by a live branch that failed half-way (migrateRam): this migration must not wait.
        { capability: "pause-before-switchover", state: false },
      ],
    });
    await this.qmp.execute("migrate", { uri: `file:${file}` });
    const deadline = Date.now() + timeoutMs;
    for (let delay = 1; ; delay = Math.min(delay * 2, 50)) {
      const m = await this.qmp.execute<{ status?: string; "error-desc"?: string }>("query-migrate");
      if (m.status === "completed") return;
      if (m.status === "failed" || m.status === "cancelled") {
        throw new ForkdError("vmm_error", `saving device state failed: ${m["error-desc"] ?? m.status}`);
      }
      if (Date.now() > deadline) throw new ForkdError("timeout", "saving device state timed out");
      await sleep(delay);
    }
  }

  /** Asks QEMU to quit; SIGKILL if it does not within `graceMs`. */
  async stop(graceMs = 3_000): Promise<void> {
    if (this.hasExited) return;
    try {
      await this.qmp.execute("quit", undefined, graceMs);
    } catch {
      /* the connection closes as it quits, or it is already gone */
    }
    try {
      await this.waitExit(graceMs);
    } catch {
      await this.kill();
    }
  }

  async kill(): Promise<void> {
    if (this.hasExited) return;
    try {
      process.kill(this.pid, "SIGKILL");
    } catch {
      /* already gone */
    }
    await this.waitExit(10_000);
  }
}

export interface DriverOptions {
  /**
   * The launcher QEMU starts through (native/jailer/forkd-jailer): it sets the process policy (no
   * transparent huge pages) and execs QEMU in the same process. Without it QEMU starts directly.
   */
  jailer?: string;
  /** Uid, mount namespace and cgroup per VMM (with the jailer only). */
  jail?: Jail;
}

export class QemuDriver implements VmmDriver {
  constructor(
    readonly binary: string,
    readonly opts: DriverOptions = {},
  ) {}

  /**
   * Starts QEMU and connects QMP. With `incoming`, the VM is left paused after its state loads:
   * the caller connects the agent, then resumes.
   */
  async launch(l: VmLaunch, opts: LaunchOptions = {}): Promise<QemuVm> {
    const files = vmFiles(l.dir);
    const jailer = this.opts.jailer;
    const jail =
      jailer && this.opts.jail && l.jail ? await this.opts.jail.prepare({ dir: l.dir, ...l.jail }) : null;
    if (l.netns && !jailer) {
      throw new ForkdError("unavailable", "starting a VMM in a network namespace needs the jailer");
    }
    const binary = opts.binary ?? this.binary;
    // The jailer joins the slot's namespace and opens its tap as root (TAP_FD), before it drops
    // to the VM's uid: a jailed VMM could not attach the tap itself.
    const net = [
      ...(l.netns ? ["--netns", l.netns] : []),
      ...(l.nic?.backend.kind === "tap" ? ["--tap", l.nic.backend.ifname] : []),
    ];
    const [cmd, args] = jailer
      ? [jailer, [...(jail?.args ?? ["--no-thp"]), ...net, "--", binary, ...qemuArgs(l)]]
      : [binary, qemuArgs(l)];
    const log = await open(files.log, "a", 0o600);
    // Its environment is its own, not the daemon's (childEnv): whatever reaches its uid can read it.
    const child = spawn(cmd, args, {
      detached: true,
      stdio: ["ignore", log.fd, log.fd],
      env: childEnv({ MALLOC_ARENA_MAX: "2" }),
    });
    await log.close();
    child.unref();
    const pid = child.pid;
    if (pid === undefined) {
      throw new ForkdError("vmm_error", `cannot start ${binary}`);
    }
    let exited = false;
    let vm: QemuVm | null = null;
    let onGone: (v: ExitVerdict) => void = () => undefined;
    const released = new Promise<ExitVerdict>((r) => (onGone = r));
    child.once("exit", () => {
      exited = true;
      // The verdict is read before the cgroup goes; then whoever waits on the exit learns why.
      void (jail ? jail.release() : Promise.resolve({ oomKilled: false, memoryLimitMiB: null })).then(
        (v) => {
          onGone(v);
          vm?.markExited();
        },
        () => {
          onGone({ oomKilled: false, memoryLimitMiB: null });
          vm?.markExited();
        },
      );
    });
    const abort = new AbortController();
    child.once("exit", () => abort.abort(new ForkdError("vmm_error", "QEMU exited during start")));
    opts.signal?.addEventListener("abort", () => abort.abort(opts.signal?.reason), { once: true });
    try {
      const startTime = await processStartTime(pid);
      const qmp = await QmpClient.connect(files.qmp, opts.timeoutMs ?? 10_000, abort.signal);
      vm = new QemuVm({ pid, startTime: startTime ?? 0 }, l.dir, qmp, true);
      vm.released = released;
      if (typeof jail?.uid === "number" && typeof this.opts.jail?.gid === "number")
        vm.owner = { uid: jail.uid, gid: this.opts.jail.gid };
      if (exited) void released.then(() => vm?.markExited());
      return vm;
    } catch (e) {
      child.kill("SIGKILL");
      const tail = await readTail(files.log);
      throw new ForkdError(
        "vmm_error",
        `QEMU did not come up: ${errorMessage(e)}${tail ? `: ${tail}` : ""}`,
        {},
        e,
      );
    }
  }

  consoleTail(dir: string, bytes: number): Promise<string> {
    return readTail(vmFiles(dir).console, bytes);
  }

  /** Re-adopts a VM started by an earlier daemon, if it is still the same process. */
  async adopt(id: VmIdentity, dir: string): Promise<QemuVm | null> {
    if (!isAlive(id.pid) || (await processStartTime(id.pid)) !== id.startTime) return null;
    const cmd = await processCmdline(id.pid);
    if (!cmd.some((a) => a.includes(vmFiles(dir).qmp))) return null;
    const qmp = await QmpClient.connect(vmFiles(dir).qmp, 15_000);
    const vm = new QemuVm(id, dir, qmp, false);
    const jail = this.opts.jail;
    if (jail) {
      const uid = await processUid(id.pid);
      if (uid !== null) jail.reserve(uid);
      if (uid !== null && uid !== 0 && jail.gid !== null) vm.owner = { uid, gid: jail.gid };
      let onGone: (v: ExitVerdict) => void = () => undefined;
      vm.released = new Promise<ExitVerdict>((r) => (onGone = r));
      vm.onExit(() => {
        void jail.cgroups
          .verdict(basename(dir))
          .then(async (v) => {
            await jail.cgroups.remove(basename(dir)).catch(() => undefined);
            if (uid !== null) jail.releaseUid(uid);
            onGone(v);
          })
          .catch(() => onGone({ oomKilled: false, memoryLimitMiB: null }));
      });
    }
    return vm;
  }
}

async function readTail(path: string, bytes = 2048): Promise<string> {
  // The VMM owns the file: read without following a link it may have put there.
  const tail = await readFileTail(path, bytes).catch(() => null);
  return tail ? tail.bytes.toString("utf8").trim() : "";
}

/** The real uid of a process (from /proc/PID/status), or null when it is gone. */
async function processUid(pid: number): Promise<number | null> {
  try {
    const m = /^Uid:\s+(\d+)/m.exec(await readFile(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}
