/**
 * Which uids a daemon's jailed VMMs run as. Two daemons on one host (two data directories) must
 * never share one: a VMM could then signal, ptrace or read the environment of the other's.
 *
 *   - The range is a block of BLOCK uids (VMMs get all but its first) chosen by a hash of the
 *     data directory, as its network block is (src/net/slots.ts), in [FLOOR, 2^31): clear of
 *     the range every daemon shared before (1900000000:65536) and of real and subordinate uids.
 *   - It is recorded in the data directory (jail-uids.json): a restarted daemon keeps the uids
 *     its running VMMs have.
 *   - It is claimed while the daemon runs: one abstract unix socket per BLOCK-uid block it
 *     touches, exclusive and released by the kernel when the daemon dies (as the daemon lock,
 *     src/host/daemon-lock.ts). A block another daemon claims, or that a process other than this data
 *     directory's VMMs runs as (a VMM of a stopped daemon, or of one that claims nothing), is
 *     not taken: the next block is tried.
 *   - FORKD_JAIL_UIDS=BASE:COUNT sets the range instead; an overlap is then refused.
 * Their group is not per daemon: see DEFAULT_JAIL_GID.
 */
import { createHash } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import { createServer } from "node:net";
import type { Server } from "node:net";
import { join } from "node:path";
import { writeFileAtomic } from "../util/index.js";
import { ForkdError } from "../util/index.js";

export interface UidRange {
  /** VMMs get base+1 .. base+count. */
  base: number;
  count: number;
}

/**
 * The group every daemon's VMMs share (FORKD_JAIL_GID): it reads the guest image cache, which
 * daemons share; the one every daemon used before ranges were per data directory.
 */
export const DEFAULT_JAIL_GID = 1_900_000_000;

/** FORKD_JAIL_GID, checked to lie outside the VMMs' uids (`range`). */
export function jailGid(env: NodeJS.ProcessEnv, range: UidRange): number {
  const spec = env.FORKD_JAIL_GID ?? String(DEFAULT_JAIL_GID);
  const gid = /^\d{1,10}$/.test(spec) ? Number(spec) : NaN;
  if (!(gid >= 1000 && gid < 2 ** 32 - 1) || (gid > range.base && gid <= range.base + range.count)) {
    throw new ForkdError(
      "invalid_argument",
      `FORKD_JAIL_GID must be a group id >= 1000 outside the VMMs' uids (got ${JSON.stringify(spec)})`,
    );
  }
  return gid;
}

export const BLOCK = 4096;
/** The first derived block starts here (1900134400: block-aligned, above the range every daemon used to share). */
export const FLOOR = 463_900 * BLOCK;
/** Derived blocks end below 2^31 (some tools read uids as signed 32-bit numbers). */
export const BLOCKS = Math.floor((2 ** 31 - FLOOR) / BLOCK);
/** How many blocks after the derived one a daemon tries before giving up. */
const PROBES = 64;
const RECORD = "jail-uids.json";

/** The range of block `k` (0 <= k < BLOCKS). */
export const blockRange = (k: number): UidRange => ({ base: FLOOR + k * BLOCK, count: BLOCK - 1 });

/** The block a data directory's range is derived from. */
export function derivedBlock(dataDir: string): number {
  return createHash("sha256").update(dataDir).digest().readUInt32BE(0) % BLOCKS;
}

/** Parses FORKD_JAIL_UIDS ("BASE:COUNT"). */
export function parseUidRange(spec: string): UidRange {
  const m = /^(\d{1,10}):(\d{1,6})$/.exec(spec);
  const base = Number(m?.[1]);
  const count = Number(m?.[2]);
  if (!m || base < 1000 || count < 1 || base + count >= 2 ** 32 - 1) {
    throw new ForkdError(
      "invalid_argument",
      `FORKD_JAIL_UIDS must be BASE:COUNT with BASE >= 1000 (got ${JSON.stringify(spec)})`,
    );
  }
  return { base, count };
}

/** Whether two ranges share a uid (their bases count: claims are by block). */
export const overlaps = (a: UidRange, b: UidRange): boolean =>
  a.base <= b.base + b.count && b.base <= a.base + a.count;

/** The BLOCK-uid blocks (by number: uid / BLOCK) that `r` touches. */
export const blocksOf = (r: UidRange): number[] => {
  const out: number[] = [];
  for (let b = Math.floor(r.base / BLOCK); b <= Math.floor((r.base + r.count) / BLOCK); b++) out.push(b);
  return out;
};

/** A running process: its real uid and whether it belongs to this data directory (its VMMs). */
export interface HostProcess {
  pid: number;
  uid: number;
  ours: boolean;
}

/** The first process of `procs` (not ours) whose uid is in `r`, if any. */
export const foreignIn = (r: UidRange, procs: HostProcess[]): HostProcess | undefined =>
  procs.find((p) => !p.ours && p.uid >= r.base && p.uid <= r.base + r.count);

/** Every process on the host with its real uid; `ours` if its command line names a path under `dataDir`. */
export async function hostProcesses(dataDir: string): Promise<HostProcess[]> {
  const out: HostProcess[] = [];
  const mine = dataDir.endsWith("/") ? dataDir : `${dataDir}/`;
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const m = /^Uid:\s+(\d+)/m.exec(await readFile(`/proc/${name}/status`, "utf8"));
      if (!m) continue;
      const uid = Number(m[1]);
      if (uid < 1000) continue; // never a jail uid: no need to read its command line
      const cmd = (await readFile(`/proc/${name}/cmdline`, "utf8")).split("\0");
      // A VMM's arguments name its files (path=DIR/sandboxes/ID/qmp.sock, ...).
      out.push({ pid: Number(name), uid, ours: cmd.some((a) => a.includes(mine)) });
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

export interface UidClaim extends UidRange {
  /** Gives the range up (the daemon stops). */
  release(): Promise<void>;
}

/** Claims the blocks of `r` (all or none); null if another daemon holds one. */
export async function claimBlocks(r: UidRange): Promise<(() => Promise<void>) | null> {
  const held: Server[] = [];
  const releaseAll = () =>
    Promise.all(held.map((s) => new Promise<void>((ok) => s.close(() => ok())))).then(() => undefined);
  for (const b of blocksOf(r)) {
    const s = await listenAbstract(`\0forkd-jail-uids-${b}`);
    if (!s) {
      await releaseAll();
      return null;
    }
    held.push(s);
  }
  return releaseAll;
}

function listenAbstract(name: string): Promise<Server | null> {
  return new Promise((resolve, reject) => {
    const server = createServer((sock) => sock.destroy());
    server.once("error", (e: NodeJS.ErrnoException) => (e.code === "EADDRINUSE" ? resolve(null) : reject(e)));
    server.listen(name, () => {
      server.unref();
      resolve(server);
    });
  });
}

/**
 * The uid range of the daemon owning `dataDir` (which it holds: see acquireDaemonLock), claimed
 * until release(). FORKD_JAIL_UIDS sets it (an overlap with another daemon's is refused);
 * otherwise the recorded one, else the derived one or the first free block after it.
 */
export async function claimUidRange(
  dataDir: string,
  env: NodeJS.ProcessEnv,
  procs?: HostProcess[],
): Promise<UidClaim> {
  const running = procs ?? (await hostProcesses(dataDir));
  const tryRange = async (r: UidRange): Promise<{ claim: UidClaim } | { busy: string }> => {
    const foreign = foreignIn(r, running);
    if (foreign) return { busy: `process ${foreign.pid} runs as uid ${foreign.uid}` };
    const release = await claimBlocks(r);
    if (!release) return { busy: "another forkd daemon claims it" };
    return { claim: { ...r, release } };
  };
  const show = (r: UidRange) => `${r.base}:${r.count}`;
  if (env.FORKD_JAIL_UIDS) {
    const r = parseUidRange(env.FORKD_JAIL_UIDS);
    const got = await tryRange(r);
    if ("claim" in got) return got.claim;
    throw new ForkdError(
      "conflict",
      `FORKD_JAIL_UIDS ${show(r)} overlaps uids in use: ${got.busy}; give this daemon a range of its own`,
    );
  }
  const record = join(dataDir, RECORD);
  const recorded = await readRecord(record);
  if (recorded) {
    const got = await tryRange(recorded);
    if ("claim" in got) return got.claim;
  }
  const k0 = derivedBlock(dataDir);
  const tried: string[] = [];
  for (let i = 0; i < PROBES; i++) {
    const r = blockRange((k0 + i) % BLOCKS);
    const got = await tryRange(r);
    if ("claim" in got) {
      if (!recorded || recorded.base !== r.base || recorded.count !== r.count)
        await writeFileAtomic(record, JSON.stringify(r) + "\n", 0o600);
      return got.claim;
    }
    tried.push(`${show(r)}: ${got.busy}`);
  }
  throw new ForkdError(
    "conflict",
    `no free jail uid range (tried ${tried.slice(0, 3).join("; ")}, ...); set FORKD_JAIL_UIDS`,
  );
}

async function readRecord(path: string): Promise<UidRange | null> {
  try {
    const v = JSON.parse(await readFile(path, "utf8")) as Partial<UidRange>;
    if (Number.isInteger(v.base) && Number.isInteger(v.count)) return parseUidRange(`${v.base}:${v.count}`);
  } catch {
    /* none yet, or unreadable: derived again */
  }
  return null;
}
