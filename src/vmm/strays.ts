/**
 * Processes a dead daemon left behind: VMMs (QEMU, started through the jailer), and the helpers
 * it ran on their files (forkd-memsnap, qemu-img, tar; a jailed qemu-img is its PID namespace's
 * init under a waiting jailer, and ends with it), still referencing a directory the new
 * daemon is about to remove or re-use (its run/ directory, a snapshot staging directory, a
 * sandbox without a usable record). They are not the new daemon's children, so it cannot wait
 * for them as a parent would: it SIGKILLs them and polls until each is gone.
 *
 * A process is ours only if its command line names one of those directories AND its executable
 * (/proc/PID/exe, not argv[0], which anyone can set) is one of the programs forkd runs. Anything
 * else that happens to mention the path is left alone.
 */
import { readdir, readlink, realpath } from "node:fs/promises";
import type { Logger } from "../util/index.js";
import { basename } from "node:path";
import { isAlive, processCmdline, processStartTime } from "../util/index.js";
import { sleep } from "../util/index.js";

export interface StrayProcess {
  pid: number;
  /** Its /proc start time: a pid reused since list() is not this process. */
  startTime: number;
  exe: string;
  args: string[];
}

/** Strays only warn. */
export type StrayLogger = Pick<Logger, "warn">;

/** Helpers forkd runs by name from PATH (their exact path is not known in advance). */
const PATH_PROGRAMS = new Set(["qemu-img", "tar"]);

export class Strays {
  private programs: Set<string> | null = null;

  /** `paths`: the QEMU binaries, the jailer and forkd-memsnap this daemon runs. */
  constructor(
    private readonly paths: string[],
    private readonly log: StrayLogger,
    private readonly waitMs = 10_000,
  ) {}

  private async known(): Promise<Set<string>> {
    if (!this.programs) {
      const out = new Set<string>();
      for (const p of this.paths) {
        out.add(p);
        out.add(await realpath(p).catch(() => p));
      }
      this.programs = out;
    }
    return this.programs;
  }

  /** Whether `exe` (a /proc/PID/exe target) is a program forkd runs. */
  private async isOurs(exe: string): Promise<boolean> {
    const path = exe.replace(/ \(deleted\)$/, "");
    const name = basename(path);
    return (await this.known()).has(path) || PATH_PROGRAMS.has(name) || name.startsWith("qemu-system-");
  }

  /** forkd's processes (by executable) other than this one, with their arguments. */
  async list(): Promise<StrayProcess[]> {
    const out: StrayProcess[] = [];
    for (const name of await readdir("/proc")) {
      if (!/^\d+$/.test(name)) continue;
      const pid = Number(name);
      if (pid === process.pid) continue;
      const exe = await readlink(`/proc/${pid}/exe`).catch(() => null);
      if (exe === null) continue; // gone, a kernel thread, or not ours to see (nor to kill)
      if (!(await this.isOurs(exe))) continue;
      const startTime = await processStartTime(pid);
      if (startTime !== null) out.push({ pid, startTime, exe, args: await processCmdline(pid) });
    }
    return out;
  }

  /**
   * Kills forkd's processes with an argument containing any of `needles` (path prefixes: a
   * directory with its trailing "/", or a name prefix such as `<snapshots>/.staging-`) and
   * waits (bounded) until they are gone, so what they held (a deleted memory file, a jail uid, a
   * disk layer) is free. `among`: a list() taken earlier (recovery scans /proc once). Returns
   * the pids killed.
   */
  async kill(needles: string[], why: string, among?: StrayProcess[]): Promise<number[]> {
    const procs = among ?? (await this.list());
    const pids: number[] = [];
    for (const p of procs) {
      if (!p.args.some((a) => needles.some((n) => a.includes(n)))) continue;
      if ((await processStartTime(p.pid)) === p.startTime) pids.push(p.pid);
    }
    for (const pid of pids) {
      this.log.warn("killing a process a dead daemon left behind", { pid, why });
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        /* gone already */
      }
    }
    const deadline = Date.now() + this.waitMs;
    for (const pid of pids) {
      while (isAlive(pid) && Date.now() < deadline) await sleep(20);
      if (isAlive(pid)) this.log.warn("a killed process has not exited yet", { pid, why });
    }
    return pids;
  }
}
