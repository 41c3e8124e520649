/**
 * Snapshot metadata: versioned, self-checksummed, written atomically. See docs/snapshot-format.md.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { readFile } from "node:fs/promises";
import { z } from "zod";
import { EVAL_LANGUAGES } from "../agent/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { writeJsonAtomic } from "../util/index.js";
import { ImageSource, TemplateSource } from "../image/index.js";

/**
 * The format this forkd writes for a snapshot with a full memory image. 2 added `source` (where
 * the snapshot came from: a template, an image, a Dockerfile); format 1 (no `source`) is still
 * read, as made from its `template`.
 */
export const SNAPSHOT_FORMAT = 2 as const;

/**
 * The format of a snapshot whose memory is a diff (`memoryBase`, `files.memoryDiff`): a forkd
 * that reads only format 2 must refuse it rather than fork from the base image alone. Snapshots
 * with a full image keep format 2, so older forkds read them (and packs of them) as before.
 */
export const SNAPSHOT_FORMAT_DIFF = 3 as const;

/** Formats this forkd reads. */
const FORMATS = [1, 2, 3] as const;

/** Where a snapshot came from: one of forkd's templates, an OCI image, a Dockerfile build. */
export const SnapshotSourceSchema = z.discriminatedUnion("kind", [
  TemplateSource,
  ImageSource,
  z.object({
    kind: z.literal("dockerfile"),
    /** FROM as the Dockerfile wrote it (build arguments substituted). */
    from: z.string().max(1024),
    /** What FROM resolved to: a template (forkd://NAME) or a pulled image. */
    base: z.discriminatedUnion("kind", [TemplateSource, ImageSource]),
    /** The last build step's cache key: the same key, the same root filesystem. */
    key: z.string().regex(/^[0-9a-f]{64}$/),
  }),
]);
export type SnapshotSource = z.infer<typeof SnapshotSourceSchema>;

const FileSum = z.object({
  size: z.number().int().nonnegative(),
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
});

export const SnapshotMetaSchema = z.object({
  format: z.union([z.literal(FORMATS[0]), z.literal(FORMATS[1]), z.literal(FORMATS[2])]),
  tag: z.string(),
  /**
   * The template it was built from; of a snapshot from another source, that source's kind
   * ("image", "dockerfile"): a label, `source` says what it was.
   */
  template: z.string(),
  /** Absent only in format 1, read as `{kind: "template", name: template}`. */
  source: SnapshotSourceSchema.optional(),
  created: z.string(),
  status: z.literal("ready"),
  machine: z.object({
    memoryMiB: z.number().int(),
    vcpus: z.number().int(),
    accel: z.enum(["kvm", "tcg"]),
    cpu: z.string().max(256),
  }),
  /**
   * The guest image: `dir` is what children boot (its rootfs.ext4 is the root disk layer's
   * backing file); `content` its content address, computed from its files (image/content.ts;
   * absent in snapshots made before: their image is known by `dir` alone); `hash` the build hash
   * the builder gave it (of an unpacked or pulled snapshot: what the pack said, a label only).
   */
  image: z.object({
    hash: z.string(),
    dir: z.string(),
    kernelVersion: z.string(),
    content: z
      .string()
      .regex(/^[0-9a-f]{64}$/)
      .optional(),
  }),
  qemu: z.object({ binary: z.string(), version: z.string() }),
  warm: z.string().nullable(),
  warmEval: z.string().nullable(),
  /** The kernel warmEval ran in; absent: python (written only for another, so older readers keep reading Python snapshots). */
  warmEvalLanguage: z.enum(EVAL_LANGUAGES).optional(),
  /** Virtual size of the root disk in bytes. */
  diskSize: z.number().int().positive(),
  /**
   * `memory` is the image a child maps: of a diff snapshot, its memory base's image (size and
   * sha256 as that snapshot records them); `memoryDiff` (format 3) is the diff file, its own.
   */
  files: z.object({ memory: FileSum, vmstate: FileSum, disk: FileSum, memoryDiff: FileSum.optional() }),
  timings: z.object({ bootMs: z.number(), warmMs: z.number(), freezeMs: z.number() }),
  /**
   * How vmstate was written: "migration" (QMP migrate with x-ignore-shared: a parent's freeze) or
   * "devices" (xen-save-devices-state: a BRANCH of a running child; restored with
   * migration.send-configuration=off). Absent in snapshots made before branching existed.
   */
  stateFormat: z.enum(["migration", "devices"]).optional(),
  /**
   * The guest network device and the guest's fixed network configuration, which every child
   * inherits; `linkUp` is the link state saved in vmstate (a fork that wants the other one sets
   * it). Absent in snapshots made before networking: they have no NIC and fork with network none.
   */
  nic: z
    .object({
      addr: z.string().max(15),
      prefix: z.number().int().min(1).max(30),
      gateway: z.string().max(15),
      dns: z.string().max(15),
      gatewayMac: z.string().regex(/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/),
      mac: z.string().regex(/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/),
      linkUp: z.boolean(),
    })
    .optional(),
  /** A branch's parent snapshot (whose disk layer its own disk layer is stacked on). */
  parent: z.object({ tag: z.string(), checksum: z.string() }).nullable().optional(),
  /**
   * A diff snapshot (format 3): its memory is `memory.diff` (private pages) over the full image
   * of snapshot `tag`, an ancestor, whose memory sha256 is `checksum`. Always a full image's
   * snapshot: a child maps that image and gets the diff written in, so a branch of it captures
   * a diff relative to the same image again (cumulative, never a chain of diffs).
   */
  memoryBase: z.object({ tag: z.string(), checksum: z.string().regex(/^[0-9a-f]{64}$/) }).optional(),
  /** A branch: the sandbox it was taken from and what the pause cost. */
  branch: z
    .object({
      sandbox: z.string(),
      pauseMs: z.number(),
      privateBytes: z.number().int(),
      finishMs: z.number(),
    })
    .optional(),
  /** The tenant that owns it; null or absent: shared (made by an admin). */
  owner: z.string().nullable().optional(),
  checksum: z.string(),
});

/** A snapshot's metadata as read: `source` is always there (filled in for format 1). */
export type SnapshotMeta = z.infer<typeof SnapshotMetaSchema> & { source: SnapshotSource };

/**
 * Parsed metadata with its `source`: a format-1 snapshot (none recorded) came from its template.
 * A rewrite (writeMeta) then records it in the current format.
 */
export function withSource(parsed: z.infer<typeof SnapshotMetaSchema>): SnapshotMeta {
  if (!parsed.source && parsed.format !== 1)
    throw new ForkdError("invalid_argument", `format-${parsed.format} snapshot metadata without a source`, {
      field: "source",
    });
  return { ...parsed, source: parsed.source ?? { kind: "template", name: parsed.template } };
}
export type NicMeta = NonNullable<SnapshotMeta["nic"]>;

/**
 * A snapshot's `nic`, its keys in the schema's order: the checksum is taken over the JSON text,
 * and a parsed meta has the schema's key order.
 */
export const nicMeta = (g: Omit<NicMeta, "linkUp">, linkUp: boolean): NicMeta => ({
  addr: g.addr,
  prefix: g.prefix,
  gateway: g.gateway,
  dns: g.dns,
  gatewayMac: g.gatewayMac,
  mac: g.mac,
  linkUp,
});

/** JSON with every object's keys sorted: the same metadata hashes the same whatever built it. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v !== null && typeof v === "object") {
    const entries = Object.entries(v as Record<string, unknown>)
      .filter(([, x]) => x !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, x]) => `${JSON.stringify(k)}:${canonical(x)}`).join(",")}}`;
  }
  return JSON.stringify(v);
}

function checksumOf(meta: Omit<z.infer<typeof SnapshotMetaSchema>, "checksum">): string {
  const { checksum: _c, ...rest } = meta as SnapshotMeta;
  return createHash("sha256").update(canonical(rest)).digest("hex");
}

/**
 * The checksum snapshots written before keys were sorted carry: over the keys in the order they
 * were written, which for every writer then was the schema's order (the order zod parses into).
 */
function legacyChecksumOf(parsed: Omit<z.infer<typeof SnapshotMetaSchema>, "checksum">): string {
  return createHash("sha256")
    .update(JSON.stringify({ ...parsed, checksum: undefined }))
    .digest("hex");
}

/** A diff snapshot names both its memory base and its diff file; a full one neither. */
export const diffFieldsAgree = (m: Pick<SnapshotMeta, "memoryBase" | "files">): boolean =>
  (m.memoryBase === undefined) === (m.files.memoryDiff === undefined);

/** Writes `meta` in the current format (a rewrite of a format-1 snapshot records its source). */
export async function writeMeta(path: string, meta: Omit<SnapshotMeta, "checksum">): Promise<SnapshotMeta> {
  if (!diffFieldsAgree(meta))
    throw new ForkdError("internal", "memoryBase without files.memoryDiff, or the reverse");
  const current = { ...meta, format: meta.memoryBase ? SNAPSHOT_FORMAT_DIFF : SNAPSHOT_FORMAT };
  const full: SnapshotMeta = { ...current, checksum: checksumOf(current) };
  await writeJsonAtomic(path, full, 0o644);
  return full;
}

const MAX_META = 64 * 1024;

export async function readMeta(path: string): Promise<SnapshotMeta> {
  let raw: string;
  try {
    raw = await readFile(path, "utf8");
  } catch (e) {
    throw new ForkdError("not_found", `no snapshot metadata at ${path}`, {}, e);
  }
  if (raw.length > MAX_META) throw new ForkdError("snapshot_corrupt", `${path} is too large`);
  let parsed: z.infer<typeof SnapshotMetaSchema>;
  try {
    parsed = SnapshotMetaSchema.parse(JSON.parse(raw));
  } catch (e) {
    throw new ForkdError("snapshot_corrupt", `${path} is not valid snapshot metadata`, {}, e);
  }
  const { checksum, ...rest } = parsed;
  if (checksumOf(rest) !== checksum && legacyChecksumOf(rest) !== checksum)
    throw new ForkdError("snapshot_corrupt", `${path}: checksum mismatch`);
  if (!diffFieldsAgree(parsed) || (parsed.memoryBase && parsed.format < SNAPSHOT_FORMAT_DIFF))
    throw new ForkdError(
      "snapshot_corrupt",
      `${path}: memoryBase and files.memoryDiff go together, in format 3`,
    );
  try {
    return withSource(parsed);
  } catch (e) {
    throw new ForkdError("snapshot_corrupt", `${path}: ${errorMessage(e)}`, {}, e);
  }
}

export function sha256File(path: string): Promise<{ size: number; sha256: string }> {
  return new Promise((resolve, reject) => {
    const h = createHash("sha256");
    let size = 0;
    createReadStream(path, { highWaterMark: 1 << 20 })
      .on("data", (d) => {
        const b = d as Buffer;
        size += b.length;
        h.update(b);
      })
      .on("error", reject)
      .on("end", () => resolve({ size, sha256: h.digest("hex") }));
  });
}
