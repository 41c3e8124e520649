/**
 * The jail every VMM process runs in (enforced by native/jailer/forkd-jailer, which this module
 * builds the arguments for, and by QEMU's own seccomp filter, `-sandbox`), and the stricter one
 * of every host tool run on what a guest or a tenant wrote (prepareTool, ./jailed-tools.ts):
 *   - its own unprivileged uid, from a pool, so no VMM can signal, ptrace or read the memory of
 *     another (/proc/PID/mem needs the same uid), nor open another's files (its directory is
 *     0700 and owned by its uid); the pool is the data directory's own (src/vmm/jail-uids.ts), so
 *     neither can another daemon's VMM;
 *   - an environment of its own (src/util/proc.ts childEnv), none of the daemon's settings;
 *   - a gid that may read snapshot and guest-image files (group-readable, never writable), the
 *     same for every daemon on the host (FORKD_JAIL_GID): they share the guest image cache, and
 *     a daemon chowning its images to a gid of its own would lock the others' VMMs out;
 *   - a private mount namespace in which the daemon's data and cache directories are empty
 *     tmpfs mounts, with only the VM's own directory (read-write) and what it reads (its
 *     snapshot chain, its guest image: read-only) mounted back at their usual paths;
 *   - a cgroup with its resource limits (src/host/cgroups.ts);
 *   - no capabilities and no_new_privs.
 * A daemon that is not root cannot do any of this and runs VMMs as itself (reported by doctor).
 *
 * A host tool's jail takes its uid from the same pool, and sees less: a root of its own with
 * only the host's programs and libraries and the files at hand (no data or cache directory at
 * all), its own PID namespace (what it starts ends with it) and an empty network namespace.
 */
import { randomBytes } from "node:crypto";
import { chmod, chown, readdir, stat } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import type { Cgroups } from "../host/index.js";
import type { VmLimits } from "../host/index.js";
import { ForkdError } from "../util/index.js";
import type { UidRange } from "./jail-uids.js";

export interface JailOptions {
  /** VMMs get uidBase+1 .. uidBase+uidCount (the data directory's range: jail-uids.ts). */
  uidBase: number;
  uidCount: number;
  /** The group of every VMM: it may read snapshots and guest images. */
  gid: number;
  /** Directories hidden from every VMM (the daemon's data and cache directories). */
  hide: string[];
  /** Supplementary groups (e.g. kvm, to open /dev/kvm). */
  groups: number[];
}

/** What one VMM needs to see, besides its own directory. */
export interface JailSpec {
  /** The VM's own directory: read-write, owned by its uid. */
  dir: string;
  /** Files or directories it reads (snapshot chain, guest image). */
  reads: string[];
  limits: VmLimits;
}

/** What a host tool run jailed sees and may use (prepareTool). */
export interface ToolJailSpec {
  /** Files it reads (bound read-only; the caller made them readable by the jail's group). */
  reads: string[];
  /** Files it writes (bound read-write; the caller handed them to its uid: ./jail-files.ts). */
  writes: string[];
  limits: VmLimits;
  /** setrlimit(2) bounds of its process (forkd-jailer --rlimit R=N). */
  rlimits: Partial<Record<"as" | "cpu" | "fsize" | "nofile" | "core", number>>;
}

export interface JailedLaunch {
  /** forkd-jailer options (before `--`). */
  args: string[];
  uid: number | null;
  /** Frees the uid and the cgroup once the process is gone; returns the cgroup's verdict. */
  release(): Promise<{ oomKilled: boolean; memoryLimitMiB: number | null }>;
}

/** Whether VMMs are jailed: only a root daemon can, and FORKD_JAIL=off turns it off. */
export const jailEnabled = (env: NodeJS.ProcessEnv): boolean =>
  env.FORKD_JAIL !== "off" && process.getuid?.() === 0;

/** The jail's options: its uids come from the data directory's range (claimUidRange). */
export function jailOptions(uids: UidRange, gid: number, hide: string[], groups: number[]): JailOptions {
  return { uidBase: uids.base, uidCount: uids.count, gid, hide, groups };
}

export class Jail {
  private readonly used = new Set<number>();
  private next = 0;
  /** Paths already made group-readable in this daemon's life. */
  private readonly shared = new Set<string>();

  constructor(
    readonly opts: JailOptions | null,
    readonly cgroups: Cgroups,
  ) {}

  get gid(): number | null {
    return this.opts?.gid ?? null;
  }

  /** Marks a uid as taken by a VMM adopted from an earlier daemon. */
  reserve(uid: number): void {
    if (this.opts && uid > this.opts.uidBase && uid <= this.opts.uidBase + this.opts.uidCount)
      this.used.add(uid);
  }

  /** Frees the uid of a VMM that is gone. */
  releaseUid(uid: number): void {
    this.used.delete(uid);
  }

  private takeUid(): number {
    const o = this.opts;
    if (!o) throw new Error("no jail");
    for (let i = 0; i < o.uidCount; i++) {
      const uid = o.uidBase + 1 + ((this.next + i) % o.uidCount);
      if (!this.used.has(uid)) {
        this.used.add(uid);
        this.next = (this.next + i + 1) % o.uidCount;
        return uid;
      }
    }
    throw new ForkdError(
      "resource_exhausted",
      `all ${o.uidCount} jail uids are in use (a larger range: FORKD_JAIL_UIDS, docs/operations.md)`,
    );
  }

  async prepare(spec: JailSpec): Promise<JailedLaunch> {
    const name = basename(spec.dir);
    const args: string[] = ["--no-thp"];
    const cgroupDirs = await this.cgroups.create(name, spec.limits);
    for (const d of cgroupDirs) args.push("--cgroup", d);
    const o = this.opts;
    let uid: number | null = null;
    const release = this.releaser(name, () => uid);
    if (!o) return { args, uid, release };
    try {
      uid = this.takeUid();
      const gid = o.gid;
      await chownTree(spec.dir, uid, gid);
      for (const r of spec.reads) await this.shareRead(r, gid);
      for (const h of o.hide) args.push("--hide", h);
      args.push("--bind", spec.dir);
      for (const r of spec.reads) args.push("--bind-ro", r);
      args.push("--uid", String(uid), "--gid", String(gid));
      if (o.groups.length > 0) args.push("--groups", o.groups.join(","));
      return { args, uid, release };
    } catch (e) {
      await release();
      throw e;
    }
  }

  /** Ends a jail: its cgroup's verdict read, the cgroup removed, its uid (once taken) freed. */
  private releaser(name: string, uid: () => number | null): JailedLaunch["release"] {
    return async () => {
      const verdict = await this.cgroups.verdict(name);
      await this.cgroups.remove(name).catch(() => undefined);
      const u = uid();
      if (u !== null) this.used.delete(u);
      return verdict;
    };
  }

  /**
   * The jailer's options for one host tool (./jailed-tools.ts): with a jail, a uid of the pool,
   * a cgroup with `limits`, a root of its own holding only `reads` and `writes` besides the
   * host's programs and libraries, its own PID and network namespaces; without one (the daemon
   * is not root), only the rlimits.
   */
  async prepareTool(spec: ToolJailSpec): Promise<JailedLaunch> {
    const args: string[] = [];
    for (const [k, v] of Object.entries(spec.rlimits))
      args.push("--rlimit", `${k}=${Math.max(0, Math.floor(v))}`);
    const o = this.opts;
    if (!o)
      return { args, uid: null, release: () => Promise.resolve({ oomKilled: false, memoryLimitMiB: null }) };
    const name = `tool-${randomBytes(6).toString("hex")}`;
    let uid: number | null = null;
    const release = this.releaser(name, () => uid);
    try {
      for (const d of await this.cgroups.create(name, spec.limits)) args.push("--cgroup", d);
      uid = this.takeUid();
      args.push("--new-root", "--new-pid", "--new-net");
      for (const w of spec.writes) args.push("--bind", w);
      for (const r of spec.reads) args.push("--bind-ro", r);
      args.push("--uid", String(uid), "--gid", String(o.gid));
      return { args, uid, release };
    } catch (e) {
      await release();
      throw e;
    }
  }

  /** Makes `path` (a file, or a directory and the files in it) readable by the jail's gid. */
  private async shareRead(path: string, gid: number): Promise<void> {
    const st = await stat(path);
    // The same path may be a new snapshot of a re-used tag: keyed by inode and change time too.
    const key = `${path}\0${st.ino}\0${st.ctimeMs}`;
    if (this.shared.has(key)) return;
    // Only what is not shared yet: a chown changes a file's ctime even when it changes nothing,
    // and a pack being written of these files (tar) fails on "file changed as we read it".
    const fix = async (p: string, f: { mode: number; uid: number; gid: number }, isDir: boolean) => {
      const want = (f.mode & 0o7777) | (isDir ? 0o050 : 0o040);
      if (f.uid !== 0 || f.gid !== gid) await chown(p, 0, gid);
      if (want !== (f.mode & 0o7777)) await chmod(p, want);
    };
    await fix(path, st, st.isDirectory());
    if (st.isDirectory()) {
      for (const e of await readdir(path, { withFileTypes: true })) {
        if (!e.isFile()) continue;
        const p = join(path, e.name);
        await fix(p, await stat(p), false);
      }
    }
    this.shared.add(`${path}\0${st.ino}\0${(await stat(path)).ctimeMs}`);
  }
}

/**
 * Where to mount the empty tmpfs that hides each of `dirs` from the VMMs. Jailed VMMs must walk
 * from / to the files mounted back, so a directory on the way they could not enter (no o+x: a
 * 0700 mkdtemp parent, a home directory) is hidden instead, whole: nothing in it was visible to
 * them anyway. Nested results are dropped (the outer mount covers them).
 */
export async function hideRoots(dirs: string[]): Promise<string[]> {
  const roots: string[] = [];
  for (const dir of dirs) {
    const parts = resolve(dir).split("/").filter(Boolean);
    let root = resolve(dir);
    for (let i = 1; i < parts.length; i++) {
      const p = "/" + parts.slice(0, i).join("/");
      const st = await stat(p);
      if ((st.mode & 0o001) === 0) {
        root = p;
        break;
      }
    }
    roots.push(root);
  }
  const under = (a: string, b: string) => a === b || a.startsWith(b.endsWith("/") ? b : b + "/");
  return [...new Set(roots)].filter((r, i, all) => !all.some((o, j) => j !== i && o !== r && under(r, o)));
}

/** chown -R (the VM's own directory holds a handful of files). */
async function chownTree(dir: string, uid: number, gid: number): Promise<void> {
  await chown(dir, uid, gid);
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) await chownTree(p, uid, gid);
    else if (e.isFile() || e.isSocket()) await chown(p, uid, gid);
  }
}
