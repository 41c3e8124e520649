/**
 * Every process a local cluster left, found without guessing by name: those in one of its network
 * namespaces (its members', and the slot namespaces forkd-<id>-* of its nodes' network instances:
 * a node's VMMs, helpers and tools run in one of these), those whose environment carries its
 * marker (FORKD_LOCALCLUSTER=<cid>: the gateways, in the root namespace), and the descendants of
 * all of them. Killed with SIGKILL, then the per-sandbox cgroups they were in are removed (a node
 * killed with its VMMs never removes them).
 */
import { readdir, readFile, readlink, rmdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { isAlive, sleep } from "../util/index.js";
import { NETNS_DIR, listNetns } from "./host-net.js";
import type { ClusterState } from "./state.js";

export const MARKER = "FORKD_LOCALCLUSTER";
const MAX_ENVIRON = 1 << 20;

/** The inode numbers of the cluster's network namespaces present now. */
async function namespaceInodes(st: ClusterState): Promise<Set<string>> {
  const names = new Set<string>();
  for (const m of st.made) if (m.kind === "netns") names.add(m.name);
  const ids = st.made.flatMap((m) => (m.kind === "netid" ? [m.id] : []));
  for (const ns of await listNetns()) if (ids.some((id) => ns.startsWith(`forkd-${id}-`))) names.add(ns);
  const out = new Set<string>();
  for (const n of names) {
    const s = await stat(join(NETNS_DIR, n)).catch(() => null);
    // An unmounted leftover file is an ordinary file of the directory's filesystem, not a namespace.
    if (s && s.dev !== (await stat(NETNS_DIR)).dev) out.add(`net:[${s.ino}]`);
  }
  return out;
}

/** Processes of the cluster (this process and its ancestors never). */
export async function clusterProcesses(st: ClusterState): Promise<number[]> {
  const inodes = await namespaceInodes(st);
  const marker = `${MARKER}=${st.id}`;
  const parents = new Map<number, number>();
  const found = new Set<number>();
  for (const e of await readdir("/proc").catch(() => [] as string[])) {
    if (!/^\d+$/.test(e)) continue;
    const pid = Number(e);
    const statText = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => null);
    if (statText === null) continue;
    const fields = statText.slice(statText.lastIndexOf(")") + 2).split(" ");
    parents.set(pid, Number(fields[1]));
    if (fields[0] === "Z" || fields[0] === "X") continue; // exited, to be reaped
    const ns = await readlink(`/proc/${pid}/ns/net`).catch(() => null);
    if (ns !== null && inodes.has(ns)) {
      found.add(pid);
      continue;
    }
    const env = await readFile(`/proc/${pid}/environ`).catch(() => null);
    if (env && env.length <= MAX_ENVIRON && env.toString("utf8").split("\0").includes(marker)) found.add(pid);
  }
  // Their descendants (a tool run in a namespace of its own, whose parent is a node).
  for (let grew = true; grew;) {
    grew = false;
    for (const [pid, ppid] of parents)
      if (!found.has(pid) && found.has(ppid)) {
        found.add(pid);
        grew = true;
      }
  }
  for (let p: number | undefined = process.pid; p !== undefined && p > 1; p = parents.get(p)) found.delete(p);
  return [...found].sort((a, b) => a - b);
}

/** The per-sandbox cgroup directories (…/forkd/<name>) process `pid` is in. */
async function forkdCgroups(pid: number): Promise<string[]> {
  const text = await readFile(`/proc/${pid}/cgroup`, "utf8").catch(() => "");
  const out: string[] = [];
  for (const line of text.split("\n")) {
    const m = /^\d+:([^:]*):(\/forkd\/[a-z0-9][a-z0-9-]{0,62})$/.exec(line);
    if (!m?.[2]) continue;
    const controllers = m[1] ? [m[1], ...m[1].split(",")] : ["", "unified"];
    for (const c of controllers) out.push(join("/sys/fs/cgroup", c, m[2]));
  }
  return out;
}

/** SIGKILLs every process of the cluster; resolves with those that remain after `timeoutMs`. */
export async function killClusterProcesses(st: ClusterState, timeoutMs = 15_000): Promise<number[]> {
  const cgroups = new Set<string>();
  const deadline = Date.now() + timeoutMs;
  let left: number[] = [];
  // Again until none is found: a dying node may still have started one.
  for (;;) {
    const pids = await clusterProcesses(st);
    for (const pid of pids) {
      for (const c of await forkdCgroups(pid)) cgroups.add(c);
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        /* gone */
      }
    }
    while (pids.some(isAlive) && Date.now() < deadline) await sleep(50);
    left = pids.filter(isAlive);
    if (pids.length === 0 || Date.now() >= deadline) break;
  }
  for (const c of cgroups) await removeCgroup(c);
  return left;
}

async function removeCgroup(dir: string): Promise<void> {
  for (let i = 0; i < 50; i++) {
    try {
      await rmdir(dir);
      return;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== "EBUSY") return; // gone, or not a directory of ours
      await sleep(20);
    }
  }
}
