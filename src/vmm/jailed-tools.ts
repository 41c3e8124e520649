/**
 * Host tools (qemu-img, e2fsck) run on files a guest or a tenant wrote. A qcow2 header or an
 * ext4 image from a hostile guest is an attack on the parser reading it, so that parser runs
 * jailed, through the mechanism every VMM starts through (forkd-jailer, Jail.prepareTool in
 * ./jail.ts): an unprivileged uid of the jail's pool with no capability, a root of its own
 * showing the host's programs and libraries and only the files at hand, its own PID namespace
 * (what it starts ends with it) and an empty network namespace, a cgroup (memory, tasks), and
 * rlimits (address space, CPU time, the size of any file it writes), with a deadline and a bound
 * on its output. The files are handed to its uid for the run and taken back after
 * (./jail-files.ts). A daemon that is not root (no jail) runs them as itself, under the same
 * rlimits, deadline and output bound.
 *
 * Calls that only touch trusted files (`qemu-img create -u` of a new layer, which opens no
 * backing file) need none of this and stay plain runs (src/disk/overlay.ts says which).
 */
import { execFile } from "node:child_process";
import { constants } from "node:fs";
import { access, realpath } from "node:fs/promises";
import { join } from "node:path";
import { ForkdError } from "../util/index.js";
import { childEnv } from "../util/index.js";
import { createFor, handTo, shareRead, takeBack } from "./jail-files.js";
import type { Jail } from "./jail.js";

export interface ToolRun {
  /** Files it reads: made readable by the jail's group, bound read-only. */
  reads?: string[];
  /** Files it changes in place: handed to its uid for the run, taken back after. */
  writes?: string[];
  /** Files it creates (none may exist yet): made empty for its uid, taken back after. */
  creates?: string[];
  /** The mode of `writes` and `creates` once taken back (default 0600). */
  mode?: number;
  /** Its deadline; its CPU time is bounded by the same (RLIMIT_CPU). */
  timeoutMs: number;
  /** The largest file it may write, in bytes (RLIMIT_FSIZE): 0 for a tool that writes none. */
  maxFileBytes: number;
  /** Bound on its stdout, and on its stderr (default 1 MiB): past it, it is killed. */
  maxOutputBytes?: number;
  /** Memory of its cgroup (default 1024 MiB). */
  memoryMiB?: number;
}

export interface ToolResult {
  /** Its exit status (a run killed, timed out or out of bounds is an error instead). */
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs host tools on untrusted files (JailedTools; a test may give a plain one). */
export interface ToolRunner {
  exec(program: string, args: string[], run: ToolRun): Promise<ToolResult>;
}

/** `tools.exec`, where an exit other than 0 is an error (as util/proc.ts run). */
export async function runTool(
  tools: ToolRunner,
  program: string,
  args: string[],
  run: ToolRun,
): Promise<ToolResult> {
  const r = await tools.exec(program, args, run);
  if (r.code !== 0) {
    throw new ForkdError(
      "internal",
      `${program} ${args.join(" ")} failed: ${r.stderr.trim() || `exit ${r.code}`}`,
      { file: program, exit: r.code },
    );
  }
  return r;
}

/** Where the jail's root shows the host's own (forkd-jailer --new-root). */
const SYSTEM_DIRS = ["/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/"];
const TOOL_TASKS = 128;
const DEFAULT_MEMORY_MIB = 1024;
/** Address space: qemu-img reserves a stack per worker thread and a malloc arena or two. */
const ADDRESS_SPACE = 8 * 2 ** 30;
const SIGNALS: Record<number, string> = { 9: "SIGKILL", 24: "SIGXCPU", 25: "SIGXFSZ" };

/** How many tool runs there were, by tool and whether jailed (the daemon's metrics). */
export interface ToolRunCount {
  tool: string;
  jailed: boolean;
  runs: number;
}

export class JailedTools implements ToolRunner {
  private readonly counts = new Map<string, ToolRunCount>();

  constructor(
    /** The VMMs' jail (its uid pool and cgroups); with no options (not root) nothing is jailed. */
    private readonly jail: Jail | null,
    /** native/jailer/forkd-jailer; without it tools run as plain children. */
    private readonly jailer: string | null,
  ) {}

  /** Whether tools run jailed (a jail with options and the jailer). */
  get jailed(): boolean {
    return this.jailer !== null && this.jail?.opts !== null && this.jail?.opts !== undefined;
  }

  runs(): ToolRunCount[] {
    return [...this.counts.values()].map((c) => ({ ...c }));
  }

  async exec(program: string, args: string[], run: ToolRun): Promise<ToolResult> {
    const jail = this.jailed ? this.jail : null;
    const gid = jail?.gid ?? null;
    const path = await findProgram(program);
    const reads = [...(run.reads ?? [])];
    // A tool outside the directories the jail shows (a QEMU built elsewhere) is shown itself.
    if (jail && !SYSTEM_DIRS.some((d) => path.startsWith(d))) reads.push(path);
    const writes = [...(run.writes ?? []), ...(run.creates ?? [])];
    const rlimits = {
      core: 0,
      cpu: Math.ceil(run.timeoutMs / 1000) + 1,
      fsize: run.maxFileBytes,
      as: ADDRESS_SPACE,
      nofile: 1024,
    };
    const launch =
      this.jailer && this.jail
        ? await this.jail.prepareTool({
            reads,
            writes,
            limits: { memoryMiB: run.memoryMiB ?? DEFAULT_MEMORY_MIB, pids: TOOL_TASKS },
            rlimits,
          })
        : null;
    const uid = launch?.uid ?? null;
    const handed: string[] = [];
    let result: ToolResult | undefined;
    let failure: Error | undefined;
    try {
      if (uid !== null && gid !== null) {
        for (const r of reads) await shareRead(r, gid);
        for (const w of run.writes ?? []) {
          await handTo(w, uid, gid);
          handed.push(w);
        }
        for (const c of run.creates ?? []) {
          await createFor(c, uid, gid);
          handed.push(c);
        }
      }
      const key = `${program}\0${uid !== null}`;
      const count = this.counts.get(key) ?? { tool: program, jailed: uid !== null, runs: 0 };
      count.runs++;
      this.counts.set(key, count);
      const [file, argv] =
        launch && this.jailer ? [this.jailer, [...launch.args, "--", path, ...args]] : [path, args];
      result = await spawnBounded(program, file, argv, run);
    } catch (e) {
      failure = asError(e);
    }
    // Whatever happened, what it had is the daemon's again (and checked) before anyone reads it.
    for (const h of handed) {
      try {
        await takeBack(h, run.mode ?? 0o600);
      } catch (e) {
        failure ??= asError(e);
      }
    }
    const verdict = await launch?.release().catch(() => null);
    if (verdict?.oomKilled && failure !== undefined)
      failure = new ForkdError(
        "resource_exhausted",
        `${program} ran out of memory (its limit: ${verdict.memoryLimitMiB ?? "?"} MiB)`,
        {},
        failure,
      );
    if (failure !== undefined) throw failure;
    return result as ToolResult;
  }
}

const asError = (e: unknown): Error => (e instanceof Error ? e : new Error(String(e)));

/** The absolute path of `program` on the daemon's PATH (and the sbin directories: e2fsck). */
async function findProgram(program: string): Promise<string> {
  if (program.includes("/")) return realpath(program);
  const dirs = `${childEnv().PATH ?? ""}:/usr/sbin:/sbin`.split(":").filter((d) => d.startsWith("/"));
  for (const d of dirs) {
    const p = join(d, program);
    if (
      await access(p, constants.X_OK).then(
        () => true,
        () => false,
      )
    )
      return realpath(p);
  }
  throw new ForkdError("unavailable", `${program} is not installed (forkd doctor)`);
}

/** Runs `file` with a deadline and bounded output; `program` names it in errors. */
function spawnBounded(program: string, file: string, args: string[], run: ToolRun): Promise<ToolResult> {
  const maxBuffer = run.maxOutputBytes ?? 1 << 20;
  return new Promise((resolve, reject) => {
    const child = execFile(
      file,
      args,
      {
        timeout: run.timeoutMs,
        maxBuffer,
        killSignal: "SIGKILL",
        env: childEnv({ MALLOC_ARENA_MAX: "2", PATH: `${childEnv().PATH ?? ""}:/usr/sbin:/sbin` }),
      },
      (err, stdout, stderr) => {
        if (!err) return resolve({ code: 0, stdout, stderr });
        const e = err as NodeJS.ErrnoException & { code?: unknown; killed?: boolean; signal?: string | null };
        const tail = stderr.trim().slice(-800);
        if (e.code === "ERR_CHILD_PROCESS_STDIO_MAXBUFFER")
          return reject(
            new ForkdError("internal", `${program} wrote more than ${maxBuffer} bytes of output`),
          );
        if (e.killed && e.signal === "SIGKILL")
          return reject(new ForkdError("timeout", `${program} did not finish within ${run.timeoutMs} ms`));
        if (typeof e.code !== "number") {
          return reject(
            new ForkdError(
              "internal",
              `${program} could not run: ${tail || e.message}`,
              { file: program },
              err,
            ),
          );
        }
        // Killed by a signal: forkd-jailer's init says which (exit 128+N); without it, execFile does.
        const sig = Number(/forkd-jailer: \S+ was killed by signal (\d+)/.exec(stderr)?.[1] ?? NaN);
        const signal = Number.isFinite(sig) ? (SIGNALS[sig] ?? `signal ${sig}`) : e.signal;
        if (signal) return reject(killed(program, signal, run, tail));
        if (e.code === 127 && /^forkd-jailer: /m.test(stderr))
          return reject(
            new ForkdError("internal", `${program} could not be jailed: ${tail}`, { file: program }),
          );
        resolve({ code: e.code, stdout, stderr });
      },
    );
    child.stdin?.on("error", () => undefined);
    child.stdin?.end();
  });
}

function killed(program: string, signal: string, run: ToolRun, tail: string): ForkdError {
  if (signal === "SIGXFSZ")
    return new ForkdError(
      "resource_exhausted",
      `${program} would write a file past its bound of ${run.maxFileBytes} bytes`,
    );
  if (signal === "SIGXCPU")
    return new ForkdError("timeout", `${program} used its CPU time (${run.timeoutMs} ms)`);
  return new ForkdError("internal", `${program} was killed by ${signal}${tail ? `: ${tail}` : ""}`, {
    file: program,
  });
}
