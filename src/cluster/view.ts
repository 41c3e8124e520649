/**
 * The cluster as a gateway reads it: mirrors (src/etcd/mirror.ts: list, then watch) of nodes/,
 * holdings/, catalog/ and sandboxes/, every value checked by its schema and its key (a record
 * under another name than its own is left out), with the holdings indexed by snapshot key. A
 * sandbox the mirror does not have yet (a fork answered before the watch brought its record) is
 * read from etcd directly. Nothing here is state of its own: it is etcd's, as of the mirrors'
 * revision.
 */
import type { Kv, MirrorChange } from "../etcd/index.js";
import { PrefixMirror } from "../etcd/index.js";
import type { ClusterKeys } from "./keys.js";
import { NODE_ID_RE, keyOfSegment } from "./keys.js";
import type { Candidate } from "./placement.js";
import { CatalogEntry, Holding, NodeRecord, SandboxLocation, parseRecord } from "./records.js";
import { SANDBOX_ID_RE } from "../util/index.js";

export interface ClusterViewOptions {
  kv: Kv;
  keys: ClusterKeys;
  /** A value left out (not valid), a watch lost and resumed. */
  onProblem?: (what: string) => void;
  /** A node's key went (its lease expired, or it left): told once per disappearance. */
  onNodeGone?: (node: NodeRecord) => void;
  /** A node's key came (`joined`) or changed. */
  onNode?: (node: NodeRecord, joined: boolean) => void;
  /** A sandbox's record changed (value null: deleted). */
  onSandbox?: (c: MirrorChange<SandboxLocation>) => void;
  /** A catalog entry changed (value null: deleted). */
  onCatalog?: (c: MirrorChange<CatalogEntry>) => void;
}

/** A holding with the node that has it. */
export interface NodeHolding extends Holding {
  node: string;
}

export class ClusterView {
  readonly nodesMirror: PrefixMirror<NodeRecord>;
  readonly holdingsMirror: PrefixMirror<NodeHolding>;
  readonly catalogMirror: PrefixMirror<CatalogEntry>;
  readonly sandboxesMirror: PrefixMirror<SandboxLocation>;
  /** snapshot key → node → its holding. */
  private readonly byKey = new Map<string, Map<string, NodeHolding>>();

  constructor(private readonly o: ClusterViewOptions) {
    const k = o.keys;
    const problem = (what: string) => o.onProblem?.(what);
    this.nodesMirror = new PrefixMirror<NodeRecord>({
      kv: o.kv,
      prefix: k.nodes,
      parse: (key, raw) => {
        const r = parseRecord(NodeRecord, raw);
        return r && r.id === k.tail(key, k.nodes, NODE_ID_RE) ? r : null;
      },
      onChange: (c) => {
        if (c.value === null && c.previous !== null) o.onNodeGone?.(c.previous);
        if (c.value !== null) o.onNode?.(c.value, c.previous === null);
      },
      onProblem: problem,
    });
    this.holdingsMirror = new PrefixMirror<NodeHolding>({
      kv: o.kv,
      prefix: k.holdingsAll,
      parse: (key, raw) => {
        const [node, seg, ...rest] = key.slice(k.holdingsAll.length).split("/");
        if (node === undefined || seg === undefined || rest.length > 0 || !NODE_ID_RE.test(node)) return null;
        const h = parseRecord(Holding, raw);
        return h && h.key === keyOfSegment(seg) ? { ...h, node } : null;
      },
      onChange: (c) => this.index(c),
      onProblem: problem,
    });
    this.catalogMirror = new PrefixMirror<CatalogEntry>({
      kv: o.kv,
      prefix: k.catalog,
      parse: (key, raw) => {
        const e = parseRecord(CatalogEntry, raw);
        return e && e.key === keyOfSegment(key.slice(k.catalog.length)) ? e : null;
      },
      onChange: (c) => o.onCatalog?.(c),
      onProblem: problem,
    });
    this.sandboxesMirror = new PrefixMirror<SandboxLocation>({
      kv: o.kv,
      prefix: k.sandboxes,
      parse: (key, raw) => this.parseSandbox(key, raw),
      onChange: (c) => o.onSandbox?.(c),
      onProblem: problem,
    });
  }

  private parseSandbox(key: string, raw: string): SandboxLocation | null {
    const r = parseRecord(SandboxLocation, raw);
    return r && r.id === this.o.keys.tail(key, this.o.keys.sandboxes, SANDBOX_ID_RE) ? r : null;
  }

  private index(c: MirrorChange<NodeHolding>): void {
    const old = c.previous;
    if (old) {
      const m = this.byKey.get(old.key);
      m?.delete(old.node);
      if (m?.size === 0) this.byKey.delete(old.key);
    }
    const h = c.value;
    if (h) {
      const m = this.byKey.get(h.key) ?? new Map<string, NodeHolding>();
      m.set(h.node, h);
      this.byKey.set(h.key, m);
    }
  }

  /** Lists and follows every prefix (throws if etcd does not answer). */
  async start(): Promise<void> {
    await this.nodesMirror.start();
    await Promise.all([
      this.holdingsMirror.start(),
      this.catalogMirror.start(),
      this.sandboxesMirror.start(),
    ]);
  }

  async close(): Promise<void> {
    await Promise.all([
      this.nodesMirror.close(),
      this.holdingsMirror.close(),
      this.catalogMirror.close(),
      this.sandboxesMirror.close(),
    ]);
  }

  /** Whether every mirror follows etcd now. */
  get live(): boolean {
    return (
      this.nodesMirror.live &&
      this.holdingsMirror.live &&
      this.catalogMirror.live &&
      this.sandboxesMirror.live
    );
  }

  nodes(): NodeRecord[] {
    return [...this.nodesMirror.values()];
  }

  node(id: string): NodeRecord | undefined {
    return this.nodesMirror.get(this.o.keys.node(id));
  }

  /** The nodes holding snapshot `key`, with their warmth. */
  holders(key: string): NodeHolding[] {
    return [...(this.byKey.get(key)?.values() ?? [])];
  }

  /** Every snapshot `node` holds. */
  holdingsOf(node: string): NodeHolding[] {
    const out: NodeHolding[] = [];
    for (const m of this.byKey.values()) {
      const h = m.get(node);
      if (h) out.push(h);
    }
    return out;
  }

  catalogEntry(key: string): CatalogEntry | undefined {
    return this.catalogMirror.get(this.o.keys.catalogEntry(key));
  }

  catalogEntries(): CatalogEntry[] {
    return [...this.catalogMirror.values()];
  }

  sandboxes(): SandboxLocation[] {
    return [...this.sandboxesMirror.values()];
  }

  /** Sandbox `id`'s record: the mirror's, else etcd's (a record newer than the mirror); null: none. */
  async sandbox(id: string): Promise<SandboxLocation | null> {
    const key = this.o.keys.sandbox(id);
    const mirrored = this.sandboxesMirror.get(key);
    if (mirrored) return mirrored;
    const e = await this.o.kv.get(key);
    return e ? this.parseSandbox(key, e.value) : null;
  }

  /** Every node as placement sees it for snapshot `key` (null: none in particular). */
  candidates(key: string | null, assigned: (node: string) => number): Candidate[] {
    const held = key === null ? null : this.byKey.get(key);
    return this.nodes().map((n) => {
      const h = held?.get(n.id);
      return {
        id: n.id,
        machine: n.machine,
        draining: n.draining,
        maxSandboxes: n.capacity.maxSandboxes,
        held: n.capacity.running + n.capacity.paused,
        assigned: assigned(n.id),
        warm: h?.warm ?? 0,
        holds: h !== undefined,
      };
    });
  }
}
