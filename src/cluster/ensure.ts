/**
 * A fork of a snapshot this node lacks: when the catalog has it (made on a machine of this
 * node's kind: else 409), it is fetched from a node that holds it, once however many forks wait
 * for it (single flight), its chain with it. The transfer itself is a PeerPull (given the key
 * and a function returning its holders, best first: the origin, then the warmest, each live
 * and holding the catalog's digest); the copies it seals pass the catalog (catalog.ts
 * expectCopy). Until the peer transfer is wired in, `peerTransferUnavailable` answers 503.
 *
 * When no live peer gave it (none holds it: its holders died, or all failed), the snapshot is
 * fetched from a registry a node pushed it to (pushes.ts: newest push first, each pinned by its
 * manifest's digest and used only while the catalog names the same chain), registered under
 * the catalog's keys and owners.
 */
import { ForkdError, errorMessage } from "../util/index.js";
import type { CatalogGuard } from "./catalog.js";
import type { NodeContext } from "./context.js";
import { fetchFailed, usablePushes } from "./pushes.js";
import { Holding, NodeRecord, parseRecord } from "./records.js";
import type { CatalogEntry, MachineKind, PushRecord } from "./records.js";

/** A node that holds a snapshot, and where its REST listener is. */
export interface Holder {
  node: string;
  url: string;
}

/** Fetches snapshot `key` (and what of its chain is missing) from `holders()`, best first. */
export type PeerPull = (key: string, holders: () => Promise<Holder[]>) => Promise<void>;

/**
 * Fetches snapshot `key`'s chain from the registry push `push` recorded, registered under the
 * chain's keys with `owners` (the catalog's, root first).
 */
export type RegistryPull = (push: PushRecord, owners: (string | null)[]) => Promise<void>;

/** The placeholder until the peer transfer (src/snapshot/peer-pull.ts) is wired in. */
export const peerTransferUnavailable: PeerPull = async (key) => {
  throw new ForkdError(
    "unavailable",
    `peer transfer not available: snapshot ${key} is held by other nodes only`,
    { tag: key },
  );
};

/** How long a fork waits for the origin of a snapshot just made to show it holds it. */
const HOLDING_WAIT_MS = 10_000;

const sameMachine = (a: MachineKind, b: MachineKind): boolean =>
  a.accel === b.accel && a.qemu === b.qemu && a.cpu === b.cpu;

const kindOf = (m: MachineKind): string => `${m.accel}, QEMU ${m.qemu}, CPU ${m.cpu}`;

/**
 * The nodes in the cluster now (nodes/, read when a pull needs them). A node follows no other
 * node's record: every node rewrites its own as its load changes (up to twice a second), and N
 * nodes each watching all N records made etcd send N² events (measured by
 * bench/cluster-scale.ts: 42 KB sent per sandbox created at 100 nodes, 1 KB at 10).
 */
export async function liveNodes(c: NodeContext): Promise<NodeRecord[]> {
  const { entries } = await c.kv.list(c.keys.nodes);
  return entries.flatMap((e) => {
    const r = parseRecord(NodeRecord, e.value);
    return r && c.keys.node(r.id) === e.key ? [r] : [];
  });
}

export class SnapshotFetch {
  private readonly inflight = new Map<string, Promise<void>>();

  constructor(
    private readonly c: NodeContext,
    private readonly catalog: CatalogGuard,
    private readonly pull: PeerPull,
    private readonly fromRegistry: RegistryPull | null = null,
  ) {}

  async ensure(key: string): Promise<void> {
    // Here, or being written here (an async branch: the fork waits for it).
    if ((await this.c.store.has(key)) || (await this.c.store.pending(key))?.status === "writing") return;
    const e = this.catalog.entry(key);
    if (!e) return; // the fork says it is not found
    if (!sameMachine(e.machine, this.c.machine))
      throw new ForkdError(
        "conflict",
        `snapshot ${key} restores only on a machine like the one it was made on (${kindOf(e.machine)}); ` +
          `node ${this.c.id} is ${kindOf(this.c.machine)}`,
        { tag: key, node: this.c.id },
      );
    let flight = this.inflight.get(key);
    if (!flight) {
      flight = this.fetch(key, e).finally(() => this.inflight.delete(key));
      this.inflight.set(key, flight);
    }
    await flight;
  }

  /**
   * Nodes (live, not this one) holding `key` under the catalog's digest: origin first, then
   * warmest. A snapshot just made is in the catalog a moment before its origin's holding is
   * written: while the origin is live and no holder shows, this asks again for up to
   * HOLDING_WAIT_MS (a fork placed here right after the snapshot was made waits, not fails).
   */
  async holders(key: string): Promise<Holder[]> {
    const end = Date.now() + HOLDING_WAIT_MS;
    for (;;) {
      const nodes = await liveNodes(this.c);
      const found = await this.holdersNow(key, nodes);
      const origin = this.catalog.entry(key)?.origin;
      const originLive = origin !== undefined && origin !== this.c.id && nodes.some((n) => n.id === origin);
      if (found.length > 0 || !originLive || Date.now() >= end) return found;
      await new Promise((r) => setTimeout(r, 250));
    }
  }

  private async holdersNow(key: string, nodes: readonly NodeRecord[]): Promise<Holder[]> {
    const e = this.catalog.entry(key);
    if (!e) return [];
    const live = nodes.filter((n) => n.id !== this.c.id);
    const found = await Promise.all(
      live.map(async (n) => {
        const raw = await this.c.kv.get(this.c.keys.holding(n.id, key)).catch(() => null);
        const h = raw ? parseRecord(Holding, raw.value) : null;
        return h && h.digest === e.digest ? { n, warm: h.warm } : null;
      }),
    );
    return found
      .filter((x) => x !== null)
      .sort(
        (a, b) =>
          Number(b.n.id === e.origin) - Number(a.n.id === e.origin) ||
          b.warm - a.warm ||
          a.n.id.localeCompare(b.n.id),
      )
      .map((x) => ({ node: x.n.id, url: x.n.api }));
  }

  private async fetch(key: string, e: CatalogEntry): Promise<void> {
    // The chain down to what is here: each copy is expected under the catalog's digest.
    const chain: string[] = [];
    for (let k: string | null = key, ent: CatalogEntry | undefined = e; k && ent && chain.length < 1000;) {
      if (await this.c.store.has(k)) break;
      chain.push(k);
      this.catalog.expectCopy(k, ent.digest);
      k = ent.parent;
      ent = k ? this.catalog.entry(k) : undefined;
    }
    try {
      this.c.log.info("cluster: fetching a snapshot from a peer", { tag: key, chain: chain.length });
      await this.pull(key, () => this.holders(key));
    } catch (peer) {
      await this.fromPushes(key, peer);
    } finally {
      for (const k of chain) this.catalog.copyDone(k);
    }
  }

  /** No peer gave `key` (`peer` says why): the registries it was pushed to, newest first. */
  private async fromPushes(key: string, peer: unknown): Promise<void> {
    const pull = this.fromRegistry;
    if (!pull) throw peer;
    const pushes = await usablePushes(this.c, key).catch((e: unknown) => {
      this.c.log.warn("cluster: pushes of a snapshot not read", { tag: key, error: errorMessage(e) });
      return [];
    });
    if (pushes.length === 0) throw peer;
    const errors: string[] = [];
    for (const p of pushes) {
      const owners = p.chain.map((x) => this.catalog.entry(x.key)?.owner ?? null);
      this.c.log.info("cluster: fetching a snapshot from the registry it was pushed to", {
        tag: key,
        ref: p.ref,
        digest: p.digest,
        peer: errorMessage(peer),
      });
      try {
        await pull(p, owners);
        return;
      } catch (e) {
        errors.push(`${p.ref}@${p.digest}: ${errorMessage(e)}`);
      }
    }
    throw fetchFailed(key, peer, errors);
  }
}
