/**
 * The loop every pull of a chain's files shares, whichever its source (a registry's blobs:
 * pull.ts; peers of the cluster: peer-pull.ts): with the chain's manifest read and checked,
 * what it will download is bounded by the unpack limit and free space before anything is;
 * files this node has are not downloaded (those registration will not use: the guest image when an image
 * of its content address is here, the files of a chain snapshot here already: register.ts
 * presentHere), memory and device-state files with the sha256 of a local snapshot's are
 * hard-linked from it; every other file is fetched by the source into a staging directory,
 * verified against its size and sha256 as it streams. Then manifest.json is written with the
 * sums of the files staged, and registration verifies and publishes the chain (register.ts;
 * a file the source hashed as it staged it is not read again).
 * Nothing is left staged, whatever happens.
 */
import { mkdir, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { linkOrCopy } from "../util/index.js";
import type { Progress } from "../util/index.js";
import type { FileSum } from "./file-sums.js";
import { visibleTo } from "./namespace.js";
import { stagingName } from "./pack.js";
import type { Registered, UnpackDeps } from "./pack.js";
import { presentHere, registerStaged } from "./register.js";
import type { ChainManifest, RegisterOptions } from "./register.js";
import { memoryDiffFile } from "./store.js";
import { overLimit } from "./unpack-budget.js";
import { limitFor } from "./unpack.js";

/** One file of a chain to pull: its path in the chain's layout and what it must be. */
export interface PullFile extends FileSum {
  path: string;
  /** Bytes it takes on the wire (a registry's compressed blob), for progress. */
  wire: number;
}

/** What a source did for one file: the bytes it received and the sum of what it staged. */
export interface Fetched {
  wire: number;
  /** The file staged (a peer other than the first may hold its own disk layer and metadata). */
  sum: FileSum;
  /** `sum` was computed over the very bytes staged (registration need not read them again). */
  hashed: boolean;
}

/**
 * Stages `f` as the new file `out`, verified against its size and sha256 (or those of the
 * holder that served it, returned); `tick(n)` tells the bytes received so far of it.
 */
export type FetchFile = (f: PullFile, out: string, tick: (wireBytes: number) => void) => Promise<Fetched>;

export interface StagedPull {
  /** The chain's manifest, read and checked (its shape: pack.ts checkChainShape). */
  manifest: ChainManifest;
  /** Its files, in the order to fetch them. */
  files: PullFile[];
  fetch: FetchFile;
  /** How registration names the chain (`as`, `sameKeys`). */
  register: RegisterOptions;
  /** A word for the staging directory's name. */
  what: string;
}

export interface StagedPullResult extends Registered {
  files: { total: number; downloaded: number; reused: number };
  /** Bytes received, in all and per file downloaded (in the order fetched). */
  bytes: { downloaded: number; files: { path: string; bytes: number }[] };
}

/** Progress lines within one file: at most one per this many bytes. */
const TICK_STEP = 64 << 20;

const mib = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`;

export async function pullStaged(
  deps: UnpackDeps,
  p: StagedPull,
  progress: Progress,
): Promise<StagedPullResult> {
  const dir = deps.store.stagingDir(stagingName(p.what));
  const count = p.files.length;
  const out: StagedPullResult = {
    tag: p.manifest.tag,
    published: [],
    files: { total: count, downloaded: 0, reused: 0 },
    bytes: { downloaded: 0, files: [] },
  };
  try {
    await mkdir(dir, { mode: 0o700 });
    const skip = await presentHere(deps, p.manifest, p.register);
    const local = await localFiles(deps);
    await checkSpace(
      deps,
      p.files.filter((f) => !skip.has(f.path) && !local.has(f.sha256)),
    );
    const staged: ChainManifest["files"] = { ...p.manifest.files };
    const verified = new Map<string, FileSum>();
    // Wire bytes of every file: a file here already counts as done.
    const totalBytes = p.files.reduce((a, f) => a + f.wire, 0);
    let doneBytes = 0;
    for (const [i, f] of p.files.entries()) {
      const layer = { index: i + 1, count, path: f.path };
      const to = join(dir, f.path);
      await mkdir(dirname(to), { recursive: true, mode: 0o700 });
      const have = local.get(f.sha256);
      if (skip.has(f.path) || have) {
        if (!skip.has(f.path) && have) await linkOrCopy(have, to);
        out.files.reused++;
        doneBytes += f.wire;
        progress(`[${i + 1}/${count}] ${f.path}: here already`, {
          phase: "download",
          layer,
          done_bytes: doneBytes,
          total_bytes: totalBytes,
        });
        continue;
      }
      let next = TICK_STEP;
      const got = await p.fetch(f, to, (n) => {
        if (n < next) return;
        next = n + TICK_STEP;
        progress(`[${i + 1}/${count}] ${f.path}: ${mib(n)} of ${mib(f.wire)}`, {
          phase: "download",
          layer,
          done_bytes: doneBytes + Math.min(n, f.wire),
          total_bytes: totalBytes,
        });
      });
      staged[f.path] = got.sum;
      if (got.hashed) verified.set(f.path, got.sum);
      out.files.downloaded++;
      out.bytes.downloaded += got.wire;
      out.bytes.files.push({ path: f.path, bytes: got.wire });
      doneBytes += f.wire;
      progress(`[${i + 1}/${count}] ${f.path}: downloaded (${mib(got.wire)})`, {
        phase: "download",
        layer,
        done_bytes: doneBytes,
        total_bytes: totalBytes,
      });
    }
    await writeFile(join(dir, "manifest.json"), JSON.stringify({ ...p.manifest, files: staged }), {
      mode: 0o600,
    });
    progress("verifying and registering the chain", { phase: "register" });
    const r = await registerStaged(deps, dir, { ...p.register, allowPresent: true, verified });
    progress(`${r.tag} ready (registered: ${r.published.join(", ") || "nothing new"})`, {
      phase: "register",
    });
    return { ...out, ...r };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Refuses a pull past the unpack limit (FORKD_UNPACK_MAX_MIB) or that would not fit (with a
 * margin) on the data directory's filesystem, before anything is downloaded: every file it
 * will download is then staged at exactly its listed size (a longer one is refused as it
 * streams), so the listed sizes bound what the pull writes.
 */
async function checkSpace(deps: UnpackDeps, files: PullFile[]): Promise<void> {
  const need = files.reduce((a, f) => a + f.size, 0);
  const limit = await limitFor(deps);
  if (need > limit.bytes) throw overLimit(limit, need);
}

/**
 * Memory images and device states this host has, by sha256 (their snapshots' metadata records
 * the hashes; registration hashes them again): a branch's memory is often its sibling's.
 */
async function localFiles(deps: UnpackDeps): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const m of await deps.store.list()) {
    // Only what the caller may see: whether another tenant has some content is not its to learn.
    if (!visibleTo(deps.viewer ?? null, m.tag, m.owner)) continue;
    const f = deps.store.filesFor(m.tag);
    // A diff snapshot's own memory is its diff (files.memory is its base's, listed there).
    if (m.files.memoryDiff) out.set(m.files.memoryDiff.sha256, memoryDiffFile(f.dir));
    else out.set(m.files.memory.sha256, f.memory);
    out.set(m.files.vmstate.sha256, f.vmstate);
  }
  return out;
}
