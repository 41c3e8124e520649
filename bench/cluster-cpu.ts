/**
 * CPU time of the scale benchmark's processes (/proc/PID/stat: user + system, clock ticks of
 * 10 ms here) by component (the gateway, etcd, the node processes, the bench's own client), so a
 * run says what a create costs each of them and so how many creates per second one core of each
 * would place: on a machine of 2 cores shared by all of them, the rate measured is the machine's.
 */
import { readFile } from "node:fs/promises";

const TICK_MS = 10;

/** User + system CPU of `pid` so far, ms (NaN once it is gone). */
export async function cpuMs(pid: number | undefined): Promise<number> {
  if (!pid) return NaN;
  const s = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  // Fields after the command's closing parenthesis: state is field 3; utime 14, stime 15.
  const f = s.slice(s.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) * TICK_MS;
}

export type Components = Record<string, (number | undefined)[]>;

/** CPU ms of each component (the sum over its processes); the bench itself as `client`. */
export async function cpuOf(c: Components): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const [name, pids] of Object.entries(c))
    out[name] = (await Promise.all(pids.map(cpuMs))).reduce((a, b) => a + b, 0);
  const u = process.cpuUsage();
  out.client = (u.user + u.system) / 1000;
  return out;
}

/** b − a, per component. */
export const cpuSince = (a: Record<string, number>, b: Record<string, number>): Record<string, number> =>
  Object.fromEntries(Object.entries(b).map(([k, v]) => [k, v - (a[k] ?? 0)]));
