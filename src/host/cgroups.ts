/**
 * Host-side resource limits for one VMM process, in a cgroup of its own: memory, CPU quota and
 * weight, and the number of tasks (threads). cgroup v2 where the host has a unified hierarchy
 * with controllers; v1 (one hierarchy per controller) where it has only that (these build
 * machines); none where neither can be written (not root). The jailer joins the VMM to the
 * directories create() returns before QEMU starts, so every thread and page is charged.
 */
import { mkdir, readFile, rmdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { exists } from "../util/index.js";

export type CgroupMode = "v2" | "v1" | "none";

/** Limits of one VM; absent fields are not limited. */
export interface VmLimits {
  /** Memory of the VMM process (guest pages it wrote, QEMU itself, page cache it brought in). */
  memoryMiB?: number;
  /** CPU quota in cores (1.5 = one and a half cores' time per period). */
  cpus?: number;
  /** Relative CPU weight, 1..10000 (cgroup v2 scale; 100 is the default). */
  cpuWeight?: number;
  /** Tasks (threads) of the VMM process. */
  pids?: number;
}

/** Why a VM's cgroup says it died, if it does. */
export interface CgroupVerdict {
  oomKilled: boolean;
  memoryLimitMiB: number | null;
}

const PERIOD_US = 100_000;
const V1 = ["memory", "cpu", "pids"] as const;
/** Safe cgroup directory names only (sandbox ids; validated before they touch the disk). */
const NAME = /^[a-z0-9][a-z0-9-]{0,62}$/;

export class Cgroups {
  private constructor(
    readonly mode: CgroupMode,
    private readonly root: string,
    /** Why there are no cgroups, when mode is none. */
    readonly reason: string | null,
  ) {}

  /** Detects the host's cgroup layout; FORKD_CGROUPS=off disables limits. */
  static async detect(root = "/sys/fs/cgroup", env: NodeJS.ProcessEnv = process.env): Promise<Cgroups> {
    if (env.FORKD_CGROUPS === "off") return new Cgroups("none", root, "disabled by FORKD_CGROUPS=off");
    if (process.getuid?.() !== 0) return new Cgroups("none", root, "the daemon is not root");
    try {
      const controllers = (await readFile(join(root, "cgroup.controllers"), "utf8")).split(/\s+/);
      if (["memory", "cpu", "pids"].every((c) => controllers.includes(c))) {
        const base = join(root, "forkd");
        await mkdir(base, { recursive: true });
        await writeFile(join(root, "cgroup.subtree_control"), "+memory +cpu +pids");
        await writeFile(join(base, "cgroup.subtree_control"), "+memory +cpu +pids");
        return new Cgroups("v2", root, null);
      }
    } catch {
      /* not a v2 root with controllers; try v1 */
    }
    const missing: string[] = [];
    for (const c of V1) if (!(await exists(join(root, c, "tasks")))) missing.push(c);
    if (missing.length === 0) {
      for (const c of V1) await mkdir(join(root, c, "forkd"), { recursive: true });
      return new Cgroups("v1", root, null);
    }
    return new Cgroups("none", root, `no cgroup v2 controllers and no v1 ${missing.join(", ")} hierarchy`);
  }

  private dirs(name: string): string[] {
    if (!NAME.test(name)) throw new Error(`bad cgroup name ${JSON.stringify(name)}`);
    if (this.mode === "v2") return [join(this.root, "forkd", name)];
    if (this.mode === "v1") return V1.map((c) => join(this.root, c, "forkd", name));
    return [];
  }

  /** Creates the VM's cgroup(s) with `limits`; returns the directories its process joins. */
  async create(name: string, limits: VmLimits): Promise<string[]> {
    const dirs = this.dirs(name);
    if (dirs.length === 0) return [];
    await this.remove(name); // a leftover of a crashed daemon
    for (const d of dirs) await mkdir(d);
    await this.apply(name, limits);
    return dirs;
  }

  /** Sets the limits of an existing VM cgroup (a pre-started VM taken for a request). */
  async apply(name: string, limits: VmLimits): Promise<void> {
    const dirs = this.dirs(name);
    if (dirs.length === 0) return;
    const set = (file: string, value: string) =>
      writeFile(file, value).catch((e: unknown) => {
        throw new Error(`cannot set ${file} to ${value}: ${e instanceof Error ? e.message : String(e)}`);
      });
    const mem = limits.memoryMiB !== undefined ? String(limits.memoryMiB * 2 ** 20) : null;
    const quota = limits.cpus !== undefined ? Math.max(1000, Math.round(limits.cpus * PERIOD_US)) : null;
    if (this.mode === "v2") {
      const [d] = dirs as [string];
      if (mem) {
        await set(join(d, "memory.max"), mem);
        await set(join(d, "memory.swap.max"), "0").catch(() => undefined); // no swap accounting: fine
      }
      if (quota !== null) await set(join(d, "cpu.max"), `${quota} ${PERIOD_US}`);
      if (limits.cpuWeight !== undefined) await set(join(d, "cpu.weight"), String(limits.cpuWeight));
      if (limits.pids !== undefined) await set(join(d, "pids.max"), String(limits.pids));
    } else {
      const [m, c, p] = dirs as [string, string, string];
      if (mem) {
        // Without swap limits a VM over its limit would be swapped, not stopped. memsw may never
        // be below the memory limit: raising sets it first, lowering sets it last.
        const memsw = join(m, "memory.memsw.limit_in_bytes");
        await set(join(m, "memory.limit_in_bytes"), mem).catch(async () => {
          await set(memsw, mem);
          await set(join(m, "memory.limit_in_bytes"), mem);
        });
        await set(memsw, mem).catch(() => undefined); // absent without swap accounting
      }
      if (quota !== null) {
        await set(join(c, "cpu.cfs_period_us"), String(PERIOD_US));
        await set(join(c, "cpu.cfs_quota_us"), String(quota));
      }
      // v1 shares are 1024 for weight 100.
      if (limits.cpuWeight !== undefined)
        await set(join(c, "cpu.shares"), String(Math.max(2, Math.round((limits.cpuWeight * 1024) / 100))));
      if (limits.pids !== undefined) await set(join(p, "pids.max"), String(limits.pids));
    }
  }

  /** Whether the kernel killed a task of the VM's cgroup for memory (read before remove). */
  async verdict(name: string): Promise<CgroupVerdict> {
    const dirs = this.dirs(name);
    const none: CgroupVerdict = { oomKilled: false, memoryLimitMiB: null };
    const [d] = dirs;
    if (!d) return none;
    try {
      const events = await readFile(
        join(d, this.mode === "v2" ? "memory.events" : "memory.oom_control"),
        "utf8",
      );
      const kills = Number(/^oom_kill (\d+)$/m.exec(events)?.[1] ?? "0");
      const limit = (
        await readFile(join(d, this.mode === "v2" ? "memory.max" : "memory.limit_in_bytes"), "utf8")
      ).trim();
      const bytes = /^\d+$/.test(limit) ? Number(limit) : NaN;
      return {
        oomKilled: kills > 0,
        memoryLimitMiB: Number.isFinite(bytes) && bytes < 2 ** 60 ? Math.round(bytes / 2 ** 20) : null,
      };
    } catch {
      return none;
    }
  }

  /** Removes the VM's cgroup(s) once its process is gone. */
  async remove(name: string): Promise<void> {
    for (const d of this.dirs(name)) {
      for (let i = 0; i < 50; i++) {
        try {
          await rmdir(d);
          break;
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code === "ENOENT") break;
          // EBUSY: the exiting process is still being torn down.
          if (code !== "EBUSY" || i === 49) throw e;
          await new Promise((r) => setTimeout(r, 20));
        }
      }
    }
  }
}
