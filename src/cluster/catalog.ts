/**
 * The catalog as this node writes it: tags are cluster-wide. A new tag is claimed before any
 * work (refused when the catalog has it: 409), and its entry is written create-only, fenced on
 * the node's lease, just before the snapshot is published here (src/snapshot/store.ts): an
 * entry another node wrote meanwhile with another digest is a conflict, and nothing of the
 * creation is published. A copy fetched from a peer (ensure.ts) is expected under the
 * catalog's digest and writes no entry. A snapshot this node made that is deleted here leaves
 * the catalog (a failed unpack's, or the last step of a delete through the API: ./deleting.ts).
 */
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import type { KeyEntry, SnapshotMeta } from "../snapshot/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { NodeContext } from "./context.js";
import { metaDigestInput, snapshotDigest } from "./digest.js";
import { cutOff } from "./fence.js";
import { CatalogEntry, parseRecord } from "./records.js";

/** Ancestors followed at most (a chain is never this deep: store.ts bounds it too). */
const MAX_DEPTH = 1000;

export const alreadyExists = (tag: string, origin: string): ForkdError =>
  new ForkdError("conflict", `snapshot ${tag} already exists in the cluster (made on node ${origin})`, {
    tag,
    node: origin,
  });

export class CatalogGuard {
  /** Copies being fetched from peers, by key: the digest they hold (and how many fetches expect it). */
  private readonly copies = new Map<string, { digest: string; n: number }>();
  /** Entries written by publishing(), until their snapshot is published (or withdrawn). */
  private readonly written = new Map<string, string>();

  constructor(private readonly c: NodeContext) {}

  entry(key: string): CatalogEntry | undefined {
    return this.c.catalog.get(this.c.keys.catalogEntry(key));
  }

  lookup(key: string): KeyEntry | undefined {
    const e = this.entry(key);
    return e ? { owner: e.owner, status: "ready" } : undefined;
  }

  /** A copy of `key` under `digest` will be sealed here (a peer fetch): it passes claim and publish. */
  expectCopy(key: string, digest: string): void {
    const c = this.copies.get(key);
    this.copies.set(key, { digest, n: (c?.n ?? 0) + 1 });
  }

  copyDone(key: string): void {
    const c = this.copies.get(key);
    if (!c) return;
    if (c.n <= 1) this.copies.delete(key);
    else c.n--;
  }

  /** Whether `tag`'s entry was written and its snapshot is being published right now. */
  publishingNow(tag: string): boolean {
    return this.written.has(tag);
  }

  async claim(tag: string): Promise<void> {
    if (this.copies.has(tag)) return;
    this.c.member.admit(`snapshot ${tag}`);
    const e = this.entry(tag);
    if (e) throw alreadyExists(tag, e.origin);
  }

  async publishing(tag: string, meta: SnapshotMeta): Promise<void> {
    const copy = this.copies.get(tag);
    if (copy) {
      this.c.held.set(tag, copy.digest);
      await this.c.held.save();
      return;
    }
    this.c.member.admit(`snapshot ${tag}`);
    const entry = await this.entryOf(meta, await this.digestOf(meta));
    const value = JSON.stringify(entry);
    const r = await this.createOnly(tag, value, `snapshot ${tag}`);
    if (r === "conflict") {
      const e =
        this.entry(tag) ??
        parseRecord(CatalogEntry, (await this.c.kv.get(this.c.keys.catalogEntry(tag)))?.value ?? "");
      throw alreadyExists(tag, e?.origin ?? "another node");
    }
    if (r === "created") this.written.set(tag, value);
    // Kept before the publication: a restart must know the digest of whatever it finds here.
    this.c.held.set(tag, entry.digest);
    try {
      await this.c.held.save();
    } catch (e) {
      this.published(tag, false);
      throw e;
    }
  }

  published(tag: string, ok: boolean): void {
    const value = this.written.get(tag);
    this.written.delete(tag);
    if (ok) return;
    this.c.held.delete(tag);
    this.c.held
      .save()
      .catch((e: unknown) => this.c.log.warn("cluster: held digests not saved", { error: errorMessage(e) }));
    if (value !== undefined) void this.withdraw(tag, value);
  }

  deleted(tag: string): void {
    const digest = this.c.held.get(tag);
    this.c.held.delete(tag);
    this.c.held
      .save()
      .catch((e: unknown) => this.c.log.warn("cluster: held digests not saved", { error: errorMessage(e) }));
    const e = this.entry(tag);
    // Only this node's own entry, as it made it (a copy's, or a newer one of the tag, stays).
    if (!e || e.origin !== this.c.id || e.digest !== digest) return;
    void this.c.kv
      .get(this.c.keys.catalogEntry(tag))
      .then(async (cur) => {
        const parsed = cur ? parseRecord(CatalogEntry, cur.value) : null;
        if (!cur || parsed?.origin !== this.c.id || parsed.digest !== digest) return;
        await this.c.kv.txn(
          [{ key: cur.key, target: "mod", op: "==", value: cur.modRevision }],
          [{ type: "delete", key: cur.key }],
        );
      })
      .catch((err: unknown) =>
        this.c.log.warn("cluster: a deleted snapshot's catalog entry not removed", {
          tag,
          error: errorMessage(err),
        }),
      );
  }

  /**
   * Writes `value` at catalog/<tag> where none is, fenced. "created"; "same": the entry there is
   * this very one (a retry); "conflict": another is there. Throws `unavailable` when cut off.
   */
  async createOnly(tag: string, value: string, what: string): Promise<"created" | "same" | "conflict"> {
    const lease = this.c.member.lease;
    if (!lease) throw cutOff(what);
    const key = this.c.keys.catalogEntry(tag);
    let ok: boolean;
    try {
      ok = (
        await this.c.kv.txn(
          [
            { key: this.c.keys.node(this.c.id), target: "lease", op: "==", value: lease.id },
            { key, target: "version", op: "==", value: 0 },
          ],
          [{ type: "put", key, value }],
        )
      ).succeeded;
    } catch (e) {
      throw cutOff(what, errorMessage(e));
    }
    if (ok) return "created";
    const cur = await this.c.kv.get(key).catch((e: unknown) => {
      throw cutOff(what, errorMessage(e));
    });
    if (!cur) throw cutOff(what, "its lease no longer holds its node key");
    const mine = parseRecord(CatalogEntry, value);
    const there = parseRecord(CatalogEntry, cur.value);
    return there && mine && there.digest === mine.digest && there.origin === mine.origin
      ? "same"
      : "conflict";
  }

  /** The digest of the snapshot `meta` describes (its parent's as held here or in the catalog). */
  async digestOf(meta: SnapshotMeta, depth = 0): Promise<string> {
    const parent = meta.parent?.tag;
    return snapshotDigest(metaDigestInput(meta, parent ? await this.digestOfKey(parent, depth + 1) : null));
  }

  /** The digest of `key`: as held here, else the catalog's, else from its metadata here. */
  async digestOfKey(key: string, depth = 0): Promise<string> {
    const known = this.c.held.get(key) ?? this.entry(key)?.digest;
    if (known) return known;
    if (depth > MAX_DEPTH) throw new ForkdError("snapshot_corrupt", `snapshot chain of ${key} is too deep`);
    return this.digestOf((await this.c.store.get(key)).meta, depth);
  }

  /** The catalog entry of a snapshot made here. */
  async entryOf(meta: SnapshotMeta, digest: string): Promise<CatalogEntry> {
    const f = meta.files;
    const own = (f.memoryDiff ?? f.memory).size + f.vmstate.size + f.disk.size;
    const below = meta.parent ? (this.entry(meta.parent.tag)?.bytes ?? 0) : await dirBytes(meta.image.dir);
    return CatalogEntry.parse({
      key: meta.tag,
      owner: meta.owner ?? null,
      parent: meta.parent?.tag ?? null,
      digest,
      origin: this.c.id,
      created: meta.created,
      machine: { accel: meta.machine.accel, qemu: meta.qemu.version, cpu: meta.machine.cpu },
      bytes: own + below,
      view: this.c.view(meta),
    });
  }

  private async withdraw(tag: string, value: string): Promise<void> {
    const key = this.c.keys.catalogEntry(tag);
    await this.c.kv
      .txn([{ key, target: "value", op: "==", value }], [{ type: "delete", key }])
      .catch((e: unknown) =>
        this.c.log.warn("cluster: an unpublished snapshot's catalog entry not withdrawn", {
          tag,
          error: errorMessage(e),
        }),
      );
  }
}

/** Bytes of the regular files directly in `dir` (a guest image's), 0 when unreadable. */
async function dirBytes(dir: string): Promise<number> {
  let total = 0;
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    const st = await stat(join(dir, name)).catch(() => null);
    if (st?.isFile()) total += st.size;
  }
  return total;
}
