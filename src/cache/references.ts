/**
 * Why a cache entry must stay: what names it, found fresh on disk at each collection (never a
 * count that could drift):
 *
 *   snapshot   a snapshot of a live data directory (users.ts) names it: its meta.json's image
 *              directory, or the backing file of one of its qcow2 layers (a snapshot being
 *              written or unpacked in a `.staging-*` directory counts too)
 *   pin        a running process uses it for an operation in progress (pins.ts)
 *   open       a running process has one of its files open (a VM, a copy, a build)
 *   recent     used within the grace period (what pins cannot see: an older forkd's work)
 *   backing    a kept entry's layer is backed by a file in it (a Dockerfile step layer stacks on
 *              the layer before, the first on its base image's root filesystem)
 */
import { readdir, readFile, readlink } from "node:fs/promises";
import { join } from "node:path";
import type { CacheEntry } from "./entries.js";
import { entryIdOf } from "./entries.js";
import type { Pin } from "./pins.js";
import { qcow2Backing } from "./qcow2-backing.js";

export type Reason =
  | { why: "snapshot"; dataDir: string; tag: string }
  | { why: "pin"; pid: number; dataDir: string }
  | { why: "open"; pid: number }
  | { why: "recent"; ageS: number }
  | { why: "backing"; of: string };

export const describe = (r: Reason): string => {
  switch (r.why) {
    case "snapshot":
      return `snapshot ${r.tag} of ${r.dataDir}`;
    case "pin":
      return `in use by pid ${r.pid} (${r.dataDir})`;
    case "open":
      return `open by pid ${r.pid}`;
    case "recent":
      return `used ${r.ageS} s ago`;
    case "backing":
      return `backs ${r.of}`;
  }
};

const MAX_META = 64 * 1024;

/** The image directory a snapshot's meta.json names (not verified: a name is enough to keep). */
async function metaImageDir(path: string): Promise<string | null> {
  try {
    const raw = await readFile(path, "utf8");
    if (raw.length > MAX_META) return null;
    const m = JSON.parse(raw) as { image?: { dir?: unknown } };
    return typeof m.image?.dir === "string" ? m.image.dir : null;
  } catch {
    return null;
  }
}

/** Each (entry id, reason) the snapshots of `dataDir` give. */
export async function snapshotReferences(
  cacheDir: string,
  dataDir: string,
): Promise<Array<[string, Reason]>> {
  const out: Array<[string, Reason]> = [];
  const root = join(dataDir, "snapshots");
  for (const name of await readdir(root).catch(() => [] as string[])) {
    const dir = join(root, name);
    const tag = name;
    const names = await readdir(dir).catch(() => null);
    if (!names) continue; // a file (a failure record), or gone
    const add = (path: string | null) => {
      const id = path ? entryIdOf(cacheDir, path) : null;
      if (id) out.push([id, { why: "snapshot", dataDir, tag }]);
    };
    if (names.includes("meta.json")) add(await metaImageDir(join(dir, "meta.json")));
    for (const f of names) if (f.endsWith(".qcow2")) add(await qcow2Backing(join(dir, f)));
    // An unpack's staged image, a compact's staging: one level down too.
    for (const sub of names) {
      const inner = await readdir(join(dir, sub)).catch(() => null);
      if (!inner) continue;
      for (const f of inner) if (f.endsWith(".qcow2")) add(await qcow2Backing(join(dir, sub, f)));
    }
  }
  return out;
}

/** Entries some running process has a file of open (/proc/PID/fd). */
export async function openReferences(cacheDir: string): Promise<Array<[string, Reason]>> {
  const out: Array<[string, Reason]> = [];
  for (const p of await readdir("/proc").catch(() => [] as string[])) {
    if (!/^\d+$/.test(p)) continue;
    const pid = Number(p);
    for (const fd of await readdir(`/proc/${p}/fd`).catch(() => [] as string[])) {
      const target = await readlink(`/proc/${p}/fd/${fd}`).catch(() => null);
      if (!target?.startsWith("/")) continue;
      const id = entryIdOf(cacheDir, target.replace(/ \(deleted\)$/, ""));
      if (id) out.push([id, { why: "open", pid }]);
    }
  }
  return out;
}

export const pinReferences = (pins: Pin[]): Array<[string, Reason]> =>
  pins.map((p) => [p.entry, { why: "pin", pid: p.pid, dataDir: p.dataDir }]);

/** Each entry's dependencies: the entries its layers' backing files are in. */
export async function backingEdges(
  cacheDir: string,
  entries: CacheEntry[],
): Promise<Map<string, Set<string>>> {
  const deps = new Map<string, Set<string>>();
  for (const e of entries) {
    const set = new Set<string>();
    for (const layer of e.layers) {
      const b = await qcow2Backing(layer);
      const id = b ? entryIdOf(cacheDir, b) : null;
      if (id && id !== e.id) set.add(id);
    }
    deps.set(e.id, set);
  }
  return deps;
}
