/**
 * Which digest (./digest.ts) this node holds each of its snapshots under, kept across restarts
 * in one small file written atomically (<data>/cluster/held.json). A copy pulled from a peer is
 * held under the catalog's digest, which its own files would not give again (its disk layer
 * was rebased onto this node's paths). `cluster` names the cluster the digests were held in
 * (keys.ts cluster-id): digests held in another cluster, or in an etcd started afresh, are
 * forgotten, so the node catalogs what it has instead of removing what that cluster never had.
 */
import { mkdir, readFile } from "node:fs/promises";
import { dirname } from "node:path";
import { z } from "zod";
import { KEY_RE, writeJsonAtomic } from "../util/index.js";

const HeldFile = z.object({
  format: z.literal(1),
  cluster: z.string().max(64),
  digests: z.record(z.string().regex(KEY_RE), z.string().regex(/^[0-9a-f]{64}$/)),
});

export class HeldDigests {
  private readonly digests = new Map<string, string>();
  private cluster = "";
  private writes: Promise<void> = Promise.resolve();

  constructor(readonly path: string) {}

  /** Reads the file; a missing one is empty, an unreadable one is empty and said so (the reason). */
  async load(): Promise<string | null> {
    let raw: string;
    try {
      raw = await readFile(this.path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
      return String(e);
    }
    let parsed: z.infer<typeof HeldFile>;
    try {
      parsed = HeldFile.parse(JSON.parse(raw));
    } catch (e) {
      return `not a held-digests file: ${String(e)}`;
    }
    this.cluster = parsed.cluster;
    for (const [k, d] of Object.entries(parsed.digests)) this.digests.set(k, d);
    return null;
  }

  /** The cluster these digests were held in ("" when none). */
  get clusterId(): string {
    return this.cluster;
  }

  /** Now held in cluster `id`: digests held in another are forgotten. */
  joinCluster(id: string): void {
    if (this.cluster !== id) this.digests.clear();
    this.cluster = id;
  }

  get(key: string): string | undefined {
    return this.digests.get(key);
  }

  set(key: string, digest: string): void {
    this.digests.set(key, digest);
  }

  delete(key: string): boolean {
    return this.digests.delete(key);
  }

  keys(): string[] {
    return [...this.digests.keys()];
  }

  /** Resolves once the writes begun so far are done. */
  async settled(): Promise<void> {
    await this.writes;
  }

  /** Writes the file as it is now (writes are serialized; the last one wins). */
  save(): Promise<void> {
    const next = this.writes.then(async () => {
      await mkdir(dirname(this.path), { recursive: true, mode: 0o700 });
      await writeJsonAtomic(
        this.path,
        { format: 1, cluster: this.cluster, digests: Object.fromEntries([...this.digests].sort()) },
        0o600,
      );
    });
    this.writes = next.catch(() => undefined);
    return next;
  }
}
