/**
 * A prefix of the store kept in memory: listed once, then followed by a watch from the next
 * revision (list-then-watch, as Kubernetes' informers do), so a reader asks memory, not etcd.
 * Each value goes through `parse` (what etcd holds is checked like any input: a value that does
 * not parse is left out and reported once). A watch that ends (history compacted, a member
 * lost) is replaced by a fresh list and watch, retried with a bounded backoff until `close()`.
 * `changes` are told per key, after the mirror has applied them.
 */
import { errorMessage } from "../util/index.js";
import type { Kv, KvWatch } from "./kv.js";

export interface MirrorChange<T> {
  key: string;
  /** The new value; null: deleted (or no longer parses). */
  value: T | null;
  /** The value it replaced, if the mirror had one. */
  previous: T | null;
}

export interface MirrorOptions<T> {
  kv: Kv;
  prefix: string;
  parse: (key: string, value: string) => T | null;
  onChange?: (c: MirrorChange<T>) => void;
  onProblem?: (what: string) => void;
}

export class PrefixMirror<T> {
  private readonly map = new Map<string, T>();
  private watch: KvWatch | null = null;
  private closed = false;
  private synced = false;
  private readonly waiters: (() => void)[] = [];
  private revision = 0;

  constructor(private readonly o: MirrorOptions<T>) {}

  /** Starts following; resolves once the first list is applied (or throws if etcd does not answer). */
  async start(): Promise<void> {
    await this.sync();
  }

  /** Whether the mirror follows the store now (false between a lost watch and its resync). */
  get live(): boolean {
    return this.synced;
  }

  /** The store's revision the mirror has applied. */
  get appliedRevision(): number {
    return this.revision;
  }

  get(key: string): T | undefined {
    return this.map.get(key);
  }

  entries(): IterableIterator<[string, T]> {
    return this.map.entries();
  }

  values(): IterableIterator<T> {
    return this.map.values();
  }

  get size(): number {
    return this.map.size;
  }

  /** Resolves once the mirror has applied at least `revision` (bounded by `ms`; false: not yet). */
  async caughtUp(revision: number, ms: number): Promise<boolean> {
    const end = Date.now() + ms;
    while (this.revision < revision && Date.now() < end && !this.closed) {
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, Math.max(1, end - Date.now())).unref();
      });
    }
    return this.revision >= revision;
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.watch?.close();
    this.watch = null;
    for (const w of this.waiters.splice(0)) w();
  }

  private apply(key: string, raw: string | null, revision: number): void {
    const previous = this.map.get(key) ?? null;
    let value: T | null = null;
    if (raw !== null) {
      try {
        value = this.o.parse(key, raw);
      } catch (e) {
        this.o.onProblem?.(`${key}: ${errorMessage(e)}`);
      }
      if (value === null) this.o.onProblem?.(`${key}: not a valid record, left out`);
    }
    if (value === null) this.map.delete(key);
    else this.map.set(key, value);
    this.revision = Math.max(this.revision, revision);
    if (previous !== null || value !== null) this.o.onChange?.({ key, value, previous });
    for (const w of this.waiters.splice(0)) w();
  }

  private async sync(): Promise<void> {
    const { entries, revision } = await this.o.kv.list(this.o.prefix);
    if (this.closed) return;
    const seen = new Set<string>();
    for (const e of entries) {
      seen.add(e.key);
      this.apply(e.key, e.value, e.modRevision);
    }
    for (const k of [...this.map.keys()]) if (!seen.has(k)) this.apply(k, null, revision);
    this.revision = Math.max(this.revision, revision);
    this.watch = await this.o.kv.watch(
      this.o.prefix,
      revision + 1,
      (e) => this.apply(e.key, e.type === "put" ? e.value : null, e.modRevision),
      (err) => {
        this.synced = false;
        this.o.onProblem?.(`watch of ${this.o.prefix} ended: ${errorMessage(err)}; listing again`);
        void this.resync();
      },
    );
    this.synced = true;
  }

  private async resync(): Promise<void> {
    for (let delay = 200; !this.closed; delay = Math.min(delay * 2, 5000)) {
      await new Promise((r) => setTimeout(r, delay).unref());
      if (this.closed) return;
      try {
        await this.watch?.close();
        await this.sync();
        return;
      } catch (e) {
        this.o.onProblem?.(`resync of ${this.o.prefix}: ${errorMessage(e)}`);
      }
    }
  }
}
