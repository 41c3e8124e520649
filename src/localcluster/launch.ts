/**
 * Starting and stopping one process of a local cluster. A process runs detached (its own session,
 * its output appended to its log), so it outlives the `forkd cluster up` that started it; its pid
 * is the program's own (nsenter, unshare and sh exec into it).
 *
 * A forkd node runs in its namespace as on a host of its own: `nsenter --net` into it, then a
 * mount namespace in which /sys is a sysfs of that network namespace (so /sys/class/net lists its
 * links, as the daemon's network code expects) with the host's cgroup hierarchies mounted back
 * under /sys/fs/cgroup (per-sandbox limits), and every other mount left shared with the host.
 * `ip netns exec` is not used: it makes every mount a slave, so the namespaces the daemon adds
 * for its slots (`ip netns add`, bind mounts under /run/netns) would not be seen by the host nor
 * by the daemon's next incarnation, and it drops the cgroup mounts with /sys.
 */
import { spawn } from "node:child_process";
import { mkdir, open } from "node:fs/promises";
import { dirname } from "node:path";
import { ForkdError, isAlive, processStartTime, sleep } from "../util/index.js";
import { NETNS_DIR } from "./host-net.js";
import type { Proc } from "./state.js";

/** Mounts the node's own /sys (fd 3 keeps the host's cgroup tree reachable under it), then runs "$@". */
const SYSFS_SCRIPT =
  "mount --make-rslave /sys && exec 3</sys/fs/cgroup && mount -t sysfs sysfs /sys && " +
  'mount -c --rbind /proc/self/fd/3 /sys/fs/cgroup && exec 3<&- && exec "$@"';

/** The command line that runs `p` in its namespace. */
export function commandOf(p: Proc): string[] {
  const inNs = p.netns ? ["nsenter", `--net=${NETNS_DIR}/${p.netns}`, "--"] : [];
  const sys = p.sysfs
    ? ["unshare", "--mount", "--propagation", "unchanged", "--", "sh", "-ec", SYSFS_SCRIPT, "sh"]
    : [];
  return [...inNs, ...sys, ...p.argv];
}

export interface Started {
  pid: number;
  start: number;
  /** Resolves with how it ended (while the caller is its parent). */
  exited: Promise<{ code: number | null; signal: string | null }>;
}

/** Starts `p` detached, its output appended to p.log. */
export async function launch(p: Proc): Promise<Started> {
  await mkdir(dirname(p.log), { recursive: true, mode: 0o700 });
  const log = await open(p.log, "a", 0o600);
  const [cmd, ...args] = commandOf(p);
  const child = spawn(cmd as string, args, {
    env: p.env,
    detached: true,
    stdio: ["ignore", log.fd, log.fd],
  });
  await log.close();
  const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) => {
    child.once("exit", (code, signal) => resolve({ code, signal }));
    child.once("error", () => resolve({ code: null, signal: null }));
  });
  child.unref();
  const pid = child.pid;
  if (pid === undefined) {
    const why = await exited;
    throw new ForkdError("internal", `${p.name}: ${cmd} did not start (${JSON.stringify(why)})`);
  }
  const start = await processStartTime(pid);
  if (start === null) throw new ForkdError("internal", `${p.name} exited at once: see ${p.log}`);
  return { pid, start, exited };
}

/** Whether the process recorded for `p` runs (the same process: pid and start time). */
export async function running(p: Pick<Proc, "pid" | "start">): Promise<boolean> {
  if (p.pid === null || p.start === null || !isAlive(p.pid)) return false;
  return (await processStartTime(p.pid)) === p.start;
}

/**
 * Stops the process recorded for `p`: `signal` (SIGTERM: it may tidy up; SIGKILL: a crash), then
 * SIGKILL once `graceMs` passed. Resolves once it is gone (bounded: a process that does not die
 * within 10 s of SIGKILL is an error).
 */
export async function stop(
  p: Proc,
  signal: "SIGTERM" | "SIGKILL" = "SIGTERM",
  graceMs = 10_000,
): Promise<void> {
  if (!(await running(p))) return;
  const pid = p.pid as number;
  const kill = (s: NodeJS.Signals) => {
    try {
      process.kill(pid, s);
    } catch {
      /* gone */
    }
  };
  kill(signal);
  if (await gone(p, signal === "SIGKILL" ? 10_000 : graceMs)) return;
  kill("SIGKILL");
  if (!(await gone(p, 10_000)))
    throw new ForkdError("internal", `${p.name} (pid ${pid}) did not die of SIGKILL within 10 s`);
}

async function gone(p: Proc, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (!(await running(p))) return true;
    if (Date.now() > deadline) return false;
    await sleep(50);
  }
}
