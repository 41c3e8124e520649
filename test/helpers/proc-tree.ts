/** The processes descended from one (children, their children…), read from /proc. */
import { readdir, readFile } from "node:fs/promises";

export async function descendants(root: number): Promise<number[]> {
  const parent = new Map<number, number>();
  for (const e of await readdir("/proc").catch(() => [] as string[])) {
    if (!/^\d+$/.test(e)) continue;
    const stat = await readFile(`/proc/${e}/stat`, "utf8").catch(() => "");
    // "pid (comm) state ppid …": comm may hold spaces and parentheses.
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (Number.isInteger(ppid)) parent.set(Number(e), ppid);
  }
  const out: number[] = [];
  const want = new Set([root]);
  for (let grew = true; grew;) {
    grew = false;
    for (const [pid, pp] of parent) {
      if (want.has(pp) && !want.has(pid)) {
        want.add(pid);
        out.push(pid);
        grew = true;
      }
    }
  }
  return out;
}

export const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
