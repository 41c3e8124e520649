/**
 * What the cluster keeps in etcd (keys.ts says where), as zod schemas: every value read back is
 * parsed by its schema before it is used (a value that does not parse is left out and
 * reported: src/etcd/mirror.ts), and bounded (a node cannot fill a gateway's memory).
 */
import { z } from "zod";
import { KEY_RE, SANDBOX_ID_RE, TENANT_RE } from "../util/index.js";
import { NODE_ID_RE } from "./keys.js";

const NodeId = z.string().regex(NODE_ID_RE);
const Key = z.string().regex(KEY_RE);
const Tenant = z.string().regex(TENANT_RE);
const Sha = z.string().regex(/^[0-9a-f]{64}$/);
const Url = z
  .string()
  .max(512)
  .regex(/^https?:\/\/[^\s/]+$/, "an http(s) origin: scheme, host, port");
const Iso = z.string().max(40);

/** What a snapshot restores on: device state loads only into the same machine. */
export const MachineKind = z.object({
  accel: z.enum(["kvm", "tcg"]),
  qemu: z.string().max(64),
  cpu: z.string().max(256),
});
export type MachineKind = z.infer<typeof MachineKind>;

/** nodes/<id>: a node, while its lease lives. Written at start and on every change of load. */
export const NodeRecord = z.object({
  id: NodeId,
  /** Its REST listener (gateways and peers), and its E2B listener (null: not served). */
  api: Url,
  e2b: Url.nullable(),
  version: z.string().max(64),
  started: Iso,
  /** The lease its keys live under (hex); a new one each time it joins. */
  lease: z.string().max(32),
  machine: MachineKind,
  capacity: z.object({
    cores: z
      .number()
      .int()
      .min(0)
      .max(1 << 16),
    memoryMiB: z.number().int().min(0),
    /** FORKD_MAX_SANDBOXES: what it may hold at once. */
    maxSandboxes: z.number().int().min(0),
    running: z.number().int().min(0),
    paused: z.number().int().min(0),
    /** Memory free on the host now (MemAvailable). */
    freeMemoryMiB: z.number().int().min(0),
  }),
  /** A draining node takes no new work (its sandboxes run on). */
  draining: z.boolean(),
  updated: Iso,
});
export type NodeRecord = z.infer<typeof NodeRecord>;

/** holdings/<node>/<key>: a snapshot a node has whole (ready to fork), with its warmth. */
export const Holding = z.object({
  key: Key,
  digest: Sha,
  /** Pre-started VMMs of it in the node's warm pool, ready now. */
  warm: z
    .number()
    .int()
    .min(0)
    .max(1 << 16),
});
export type Holding = z.infer<typeof Holding>;

/**
 * catalog/<key>: a snapshot of the cluster. Written by the node that made it (create, build,
 * branch, unpack, pull); its `digest` names its content whatever node holds it: sha256 over
 * its parent's digest, its image's content address and its own files' sums (src/cluster/digest.ts).
 */
export const CatalogEntry = z.object({
  key: Key,
  /** Its tenant; null: shared; "@admin": an admin's private one (src/sandbox/branch.ts ADMIN_ONLY_OWNER). */
  owner: z.union([Tenant, z.literal("@admin")]).nullable(),
  parent: Key.nullable(),
  digest: Sha,
  origin: NodeId,
  created: Iso,
  machine: MachineKind,
  /** Bytes a node without any of its chain downloads (its files, its chain's, its image's). */
  bytes: z.number().int().min(0),
  /** The snapshot as forkd's REST API shows it (its Snapshot view), for listings. */
  view: z.record(z.string(), z.unknown()),
});
export type CatalogEntry = z.infer<typeof CatalogEntry>;

/**
 * pushes/<key>/<ref id>: a push of snapshot `key` to an OCI registry, written by the node that
 * pushed it, so that a node with no live peer holding `key` can fetch it from there (ensure.ts).
 * `digest` is the manifest's content address, which pins every blob; `chain` the cluster
 * digests (root first) of what the pusher held under each key of the chain when it pushed: a
 * record is used only while the catalog still names the same snapshots by those keys.
 */
export const PushRecord = z.object({
  key: Key,
  /** The reference pushed to (HOST/NAME:TAG); pulled by `digest`, never by its tag. */
  ref: z.string().min(3).max(512),
  digest: z.string().regex(/^sha256:[0-9a-f]{64}$/),
  insecure: z.boolean(),
  chain: z
    .array(z.object({ key: Key, digest: Sha }))
    .min(1)
    .max(64),
  node: NodeId,
  pushed: Iso,
});
export type PushRecord = z.infer<typeof PushRecord>;

export const SandboxState = z.enum(["running", "paused", "exited", "lost"]);
export type SandboxState = z.infer<typeof SandboxState>;

/** sandboxes/<id>: where a sandbox runs and its state as last known. */
export const SandboxLocation = z.object({
  id: z.string().regex(SANDBOX_ID_RE),
  node: NodeId,
  owner: Tenant.nullable(),
  tag: Key,
  state: SandboxState,
  /** Why it exited or is lost (null while running or paused). */
  reason: z.string().max(1024).nullable(),
  created: Iso,
  updated: Iso,
});
export type SandboxLocation = z.infer<typeof SandboxLocation>;

/** Bounds of one record, in bytes of JSON (a catalog entry carries its snapshot's view). */
export const MAX_RECORD_BYTES = 64 << 10;

/** Parses one stored value by its schema; null when it is not one (too large, not JSON, not valid). */
export function parseRecord<T>(schema: z.ZodType<T>, raw: string): T | null {
  if (raw.length > MAX_RECORD_BYTES) return null;
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    return null;
  }
  const r = schema.safeParse(json);
  return r.success ? r.data : null;
}
