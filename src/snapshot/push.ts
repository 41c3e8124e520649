/**
 * Push: a snapshot's pack (its chain, disk layers and guest image; pack.ts) to an OCI registry
 * as one artifact (artifact.ts), uploading only the blobs the repository lacks. For each file:
 * the cached blob digest (blobs.ts) is checked with HEAD first, so a base that is already there
 * costs neither compression nor upload; a blob this host pushed to another repository of the
 * same registry is mounted from there; anything else is compressed and uploaded.
 */
import { createReadStream } from "node:fs";
import { mkdir, readFile, rm } from "node:fs/promises";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { clientFor } from "../registry/index.js";
import type { RegistryClient, RegistrySettings } from "../registry/index.js";
import { formatRef, parseRef } from "../registry/index.js";
import { ForkdError } from "../util/index.js";
import { MEDIA, buildManifest } from "./artifact.js";
import type { Descriptor } from "./artifact.js";
import type { BlobCache, BlobRecord } from "./blobs.js";
import { stagePack, stagingName } from "./pack.js";
import type { SnapshotStore } from "./store.js";
import type { Progress } from "../util/index.js";

export interface TransferDeps {
  store: SnapshotStore;
  blobs: BlobCache;
  registry: RegistrySettings;
  /** FORKD_UNPACK_MAX_MIB in bytes: what one unpack or pull may write (null/absent: free space). */
  unpackMaxBytes?: number | null;
}

export interface PushResult {
  tag: string;
  ref: string;
  digest: string;
  blobs: { total: number; uploaded: number; mounted: number; skipped: number };
  bytes: { uploaded: number; skipped: number };
}

const mib = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`;

export async function pushSnapshot(
  deps: TransferDeps,
  tag: string,
  refText: string,
  o: { insecure: boolean },
  progress: Progress = () => undefined,
): Promise<PushResult> {
  const ref = parseRef(refText);
  if (ref.digest || !ref.tag) {
    throw new ForkdError("invalid_argument", "push to a tag (HOST/NAME:TAG), not to a digest", {
      field: "ref",
    });
  }
  await deps.store.get(tag); // 404 or corrupt before any work
  const client = clientFor(ref, deps.registry, { insecure: o.insecure, push: true });
  const repo = `${ref.host}/${ref.name}`;
  const dir = deps.store.stagingDir(stagingName(`push-${tag}`));
  const result: PushResult = {
    tag,
    ref: formatRef(ref),
    digest: "",
    blobs: { total: 0, uploaded: 0, mounted: 0, skipped: 0 },
    bytes: { uploaded: 0, skipped: 0 },
  };
  try {
    progress(`staging ${tag}: its chain, disk layers and guest image`, { phase: "stage" });
    const pack = await stagePack(deps.store, tag, dir);
    await mkdir(join(dir, ".blobs"), { mode: 0o700 });
    const layers = new Map<string, Descriptor>();
    const files = Object.entries(pack.files);
    // Bytes of the files (uncompressed): what is done of the upload phase, layer by layer.
    const totalBytes = files.reduce((a, [, f]) => a + f.size, 0);
    let doneBytes = 0;
    let n = 0;
    for (const [path, sum] of files) {
      n++;
      const tmp = join(dir, ".blobs", String(n));
      let rec = await deps.blobs.lookup(sum.sha256, sum.size);
      let fresh = false;
      if (!rec) {
        rec = await deps.blobs.compress(join(dir, path), sum, tmp);
        fresh = true;
      }
      const how = await ensureBlob(client, deps.blobs, rec, repo, ref.host, async () => {
        if (!fresh) {
          // Cached mapping, blob not there: compress again (same bytes: the compressor is the same).
          const again = await deps.blobs.compress(join(dir, path), sum, tmp);
          if (again.digest !== rec.digest) {
            throw new ForkdError("internal", `${path}: compression is not deterministic here`);
          }
        }
        return tmp;
      });
      await rm(tmp, { force: true });
      result.blobs.total++;
      result.blobs[how]++;
      if (how === "uploaded") result.bytes.uploaded += rec.compressedSize;
      else result.bytes.skipped += rec.compressedSize;
      layers.set(path, { digest: rec.digest, size: rec.compressedSize });
      doneBytes += sum.size;
      progress(`[${n}/${files.length}] ${path}: ${how} (${mib(rec.compressedSize)})`, {
        phase: "upload",
        layer: { index: n, count: files.length, path },
        done_bytes: doneBytes,
        total_bytes: totalBytes,
      });
    }

    const configBytes = await readFile(join(dir, "manifest.json"));
    const config = {
      digest: `sha256:${createHash("sha256").update(configBytes).digest("hex")}`,
      size: configBytes.length,
    };
    if (!(await client.blobExists(config.digest))) {
      await client.uploadBlob(config.digest, config.size, (s, e) =>
        createReadStream(join(dir, "manifest.json"), { start: s, end: e - 1 }),
      );
    }
    const manifest = buildManifest(pack, config, layers);
    result.digest = await client.putManifest(ref.tag, MEDIA.manifest, manifest);
    progress(`pushed ${result.ref}@${result.digest}`, { phase: "manifest" });
    return result;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Makes the blob of `rec` present in the repository: already there (skipped), mounted from
 * another repository of the same registry this host pushed it to, or uploaded from the file
 * `compressed()` yields.
 */
async function ensureBlob(
  client: RegistryClient,
  blobs: BlobCache,
  rec: BlobRecord,
  repo: string,
  host: string,
  compressed: () => Promise<string>,
): Promise<"skipped" | "mounted" | "uploaded"> {
  if (await client.blobExists(rec.digest)) {
    if (!rec.repos.includes(repo)) await blobs.noteRepo(rec, repo);
    return "skipped";
  }
  let location: string | undefined;
  const from = rec.repos.find((r) => r !== repo && r.startsWith(`${host}/`));
  if (from) {
    const m = await client.mountBlob(rec.digest, from.slice(host.length + 1));
    if (m.mounted) {
      await blobs.noteRepo(rec, repo);
      return "mounted";
    }
    location = m.location;
  }
  const file = await compressed();
  await client.uploadBlob(
    rec.digest,
    rec.compressedSize,
    (s, e) => createReadStream(file, { start: s, end: e - 1 }),
    location,
  );
  await blobs.noteRepo(rec, repo);
  return "uploaded";
}
