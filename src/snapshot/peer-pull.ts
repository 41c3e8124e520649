/**
 * Pulling a snapshot from peers of the cluster: `key`'s chain and guest image from the nodes
 * that hold it (`holders()`, best first, asked again when a round of them failed), through the
 * loop every pull shares (staged-pull.ts: only what this node lacks is downloaded, each file
 * verified against its size and sha256 as it streams, then registered with the same keys and
 * owners as on the peer: register.ts `sameKeys`).
 *
 * A file that fails (connection refused or reset, idle or too slow, a 5xx, more bytes than its
 * size, a wrong sum) moves to the next holder, resuming with `Range: bytes=N-` from the byte it
 * stopped at when that holder has the same file (its manifest lists the same sha256; a disk layer
 * and meta.json are each node's own, with its own paths and checksums, so those start again);
 * a wrong sum starts the file again from its first byte elsewhere. A holder whose manifest
 * describes another snapshot under the key (other chain, owners, memory, device state or image)
 * is not used.
 *
 * One pull per key per node: concurrent pulls of a key share the first one (each caller gets
 * its progress lines and result), and a pull whose chain shares a key with one that started
 * earlier (a base, or the key itself pulled as another's ancestor) waits for that pull first,
 * so a file is downloaded once. (Waits go only to earlier pulls: none waits in a circle.)
 */
import { createHash } from "node:crypto";
import { open } from "node:fs/promises";
import { ForkdError, errorMessage } from "../util/index.js";
import { assertKey } from "../util/index.js";
import type { Progress } from "../util/index.js";
import { sleep } from "../util/index.js";
import type { FileSum } from "./file-sums.js";
import type { UnpackDeps } from "./pack.js";
import { fetchBlob, fetchPeerManifest } from "./peer-client.js";
import type { BlobState, Holder, PeerClientOptions } from "./peer-client.js";
import type { PeerManifest } from "./peer-manifest.js";
import { pullStaged } from "./staged-pull.js";
import type { Fetched, PullFile, StagedPullResult } from "./staged-pull.js";

export type { Holder } from "./peer-client.js";

export interface PeerPullOptions extends PeerClientOptions {
  /** Rounds over the holders (each after the first asks `holders()` again) before a file fails. */
  rounds: number;
  /** Told every chunk received from a peer (the Prometheus counter of peer-pulled bytes). */
  onBytes?: (n: number) => void;
  /** Told once per pull that ended (however many callers joined it): whether it succeeded. */
  onPull?: (result: "ok" | "failed") => void;
}

export const PEER_PULL_DEFAULTS: Omit<PeerPullOptions, "bearer"> = {
  idleMs: 30_000,
  minRate: 64 << 10,
  graceMs: 20_000,
  rounds: 3,
};

export interface PeerPullResult extends StagedPullResult {
  /** The nodes that served files, in the order they first did. */
  from: string[];
}

interface Flight {
  /** Its place in the order pulls started here: a pull waits only for earlier ones. */
  seq: number;
  listeners: Set<Progress>;
  /** The keys of its chain, once its manifest is read (none if it could not be). */
  chain: Promise<Set<string>>;
  /** Settles `chain`. */
  known: (keys: Set<string>) => void;
  done: Promise<PeerPullResult>;
}

/** A file's path in a chain's layout that is each holder's own (its paths, its checksums). */
const perNode = (path: string): boolean => path.endsWith("/meta.json") || path.endsWith("/disk.qcow2");

/** Why holder `m` does not hold the snapshot `first` describes, or null: it does. */
function otherSnapshot(first: PeerManifest, m: PeerManifest): string | null {
  if (JSON.stringify(first.chain) !== JSON.stringify(m.chain)) return "another chain";
  if (JSON.stringify(first.owners) !== JSON.stringify(m.owners)) return "other owners";
  for (const [path, sum] of Object.entries(first.files)) {
    if (perNode(path)) continue;
    const o = m.files[path];
    if (!o || o.sha256 !== sum.sha256 || o.size !== sum.size) return `another ${path}`;
  }
  return null;
}

export class PeerPuller {
  private readonly flights = new Map<string, Flight>();
  private started = 0;

  constructor(private readonly o: PeerPullOptions) {}

  /** Whether a pull of `key` is in progress on this node. */
  pulling(key: string): boolean {
    return this.flights.has(key);
  }

  /**
   * Pulls `key` (its chain and image) from the nodes `holders()` names, best first; joins the
   * pull of `key` already in progress on this node, if any. Registered under the same keys and
   * owners as on the peers (`deps.viewer` must be an admin's: null).
   */
  pull(
    deps: UnpackDeps,
    key: string,
    holders: () => Promise<Holder[]>,
    progress: Progress = () => undefined,
  ): Promise<PeerPullResult> {
    assertKey(key);
    const joined = this.flights.get(key);
    if (joined) {
      joined.listeners.add(progress);
      progress(`joining the pull of ${key} in progress`, { phase: "manifest" });
      return joined.done.finally(() => joined.listeners.delete(progress));
    }
    const listeners = new Set<Progress>([progress]);
    const fan: Progress = (line, detail) => {
      for (const l of [...listeners]) {
        try {
          l(line, detail);
        } catch {
          // One caller's progress failing is not the pull's.
        }
      }
    };
    let known: (keys: Set<string>) => void = () => undefined;
    const chain = new Promise<Set<string>>((r) => (known = r));
    const flight: Flight = {
      seq: ++this.started,
      listeners,
      chain,
      known,
      done: Promise.resolve(null as never),
    };
    flight.done = this.run(deps, key, holders, fan, flight).finally(() => {
      flight.known(new Set());
      this.flights.delete(key);
    });
    flight.done.then(
      (r) => {
        if (r.published.length > 0 || r.files.downloaded > 0) this.o.onPull?.("ok");
      },
      () => this.o.onPull?.("failed"),
    );
    this.flights.set(key, flight);
    return flight.done;
  }

  private async run(
    deps: UnpackDeps,
    key: string,
    holders: () => Promise<Holder[]>,
    progress: Progress,
    self: Flight,
  ): Promise<PeerPullResult> {
    const here = async (): Promise<PeerPullResult | null> => {
      if (!(await deps.store.has(key))) return null;
      progress(`${key} is here already`, { phase: "register" });
      return {
        tag: key,
        published: [],
        files: { total: 0, downloaded: 0, reused: 0 },
        bytes: { downloaded: 0, files: [] },
        from: [],
      };
    };
    const already = await here();
    if (already) return already;
    const first = await holders();
    if (first.length === 0) throw new ForkdError("not_found", `no node holds ${key}`, { tag: key });
    const manifests = new Map<string, PeerManifest>();
    const errors: string[] = [];
    let head: { h: Holder; m: PeerManifest } | null = null;
    for (const h of first) {
      progress(`reading the manifest of ${key} from ${h.node}`, { phase: "manifest" });
      try {
        const m = await fetchPeerManifest(h, key, this.o);
        manifests.set(h.url, m);
        head = { h, m };
        break;
      } catch (e) {
        errors.push(errorMessage(e));
      }
    }
    if (!head) {
      const none = errors.length > 0 && errors.every((e) => / 404\b/.test(e));
      throw new ForkdError(
        none ? "not_found" : "unavailable",
        `no holder of ${key} answered: ${errors.join("; ")}`,
        {
          tag: key,
        },
      );
    }
    const manifest = head.m;
    self.known(new Set(manifest.chain));
    // A pull that started here earlier and registers some of this chain (the key itself, or an
    // ancestor): this one waits for it rather than download the same files again.
    for (const f of [...this.flights.values()]) {
      if (f.seq >= self.seq) continue;
      const theirs = await f.chain;
      if (!manifest.chain.some((k) => theirs.has(k))) continue;
      progress(`waiting for the pull in progress of ${[...theirs].pop() ?? ""}`, { phase: "manifest" });
      await f.done.catch(() => undefined);
    }
    const now = await here();
    if (now) return now;
    const from: string[] = [];
    const r = await pullStaged(
      deps,
      {
        manifest,
        files: Object.entries(manifest.files).map(([path, s]) => ({ path, ...s, wire: s.size })),
        fetch: (f, out, tick) =>
          this.fetchFile(key, manifest, first, holders, manifests, f, out, tick, progress, (node) => {
            if (!from.includes(node)) from.push(node);
          }),
        register: { sameKeys: true },
        what: `peer-${key}`,
      },
      progress,
    );
    return { ...r, from };
  }

  /**
   * One file, from the holders in turn (resumed where the same file stopped), for at most
   * `rounds` rounds; the sum staged is the serving holder's.
   */
  private async fetchFile(
    key: string,
    head: PeerManifest,
    first: Holder[],
    holders: () => Promise<Holder[]>,
    manifests: Map<string, PeerManifest>,
    f: PullFile,
    out: string,
    tick: (n: number) => void,
    progress: Progress,
    served: (node: string) => void,
  ): Promise<Fetched> {
    const fh = await open(out, "wx", 0o600);
    const st: BlobState = {
      target: { size: f.size, sha256: f.sha256 },
      pos: 0,
      hash: createHash("sha256"),
      wire: 0,
    };
    const restart = async (target: FileSum) => {
      st.target = target;
      st.pos = 0;
      st.hash = createHash("sha256");
      await fh.truncate(0);
    };
    const done = async (h: Holder) => {
      await fh.truncate(st.target.size);
      await fh.sync();
      served(h.node);
      return { wire: st.wire, sum: st.target, hashed: true };
    };
    const errors: string[] = [];
    /** Holders whose copy of this file did not match its sum: not asked again. */
    const bad = new Set<string>();
    try {
      for (let round = 0; round < this.o.rounds; round++) {
        let list = first;
        if (round > 0) {
          await sleep(Math.min(1000 * round, 5000));
          list = await holders().catch(() => first);
        }
        for (const h of list) {
          if (bad.has(h.url)) continue;
          // All its bytes came before a holder failed (it sent more): the sum decides.
          if (st.pos === st.target.size && st.pos > 0) {
            if (st.hash.copy().digest("hex") === st.target.sha256) return await done(h);
            await restart(st.target);
          }
          const sum = await this.sumAt(h, key, head, manifests, f.path).catch((e: unknown) => {
            errors.push(errorMessage(e));
            return null;
          });
          if (!sum) continue;
          if (sum.sha256 !== st.target.sha256 || sum.size !== st.target.size) await restart(sum);
          if (st.pos > 0)
            progress(`${f.path}: resuming at byte ${st.pos} from ${h.node}`, { phase: "download" });
          try {
            await fetchBlob(
              h,
              st,
              fh,
              this.o,
              (n) => {
                this.o.onBytes?.(n);
                tick(st.wire);
              },
              () => restart(st.target),
            );
          } catch (e) {
            errors.push(errorMessage(e));
            continue;
          }
          if (st.hash.copy().digest("hex") === st.target.sha256) return await done(h);
          // Its copy is not what its manifest says: the file starts again, elsewhere.
          errors.push(`${f.path} from ${h.node} does not match its sha256`);
          await restart(st.target);
          bad.add(h.url);
        }
      }
    } finally {
      await fh.close();
    }
    throw new ForkdError(
      "unavailable",
      `${f.path} of ${key}: no holder served it: ${errors.slice(-6).join("; ")}`,
      {
        tag: key,
        file: f.path,
      },
    );
  }

  /** The size and sha256 holder `h` has `path` at, or null: it holds another snapshot under `key`. */
  private async sumAt(
    h: Holder,
    key: string,
    head: PeerManifest,
    manifests: Map<string, PeerManifest>,
    path: string,
  ): Promise<FileSum | null> {
    let m = manifests.get(h.url);
    if (!m) {
      m = await fetchPeerManifest(h, key, this.o);
      const why = otherSnapshot(head, m);
      if (why) throw new ForkdError("conflict", `${h.node} holds another ${key} (${why})`);
      manifests.set(h.url, m);
    }
    return m.files[path] ?? null;
  }
}
