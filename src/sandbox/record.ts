/**
 * The sandbox record's schema (<data>/sandboxes/<id>/sandbox.json, see SandboxRecord): what a
 * restarted daemon parses before it trusts a record. Unknown top-level fields are kept (a field
 * added later survives a rewrite); every path the record names must lie in the sandbox's own
 * directory, since recovery and kill act on them.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { writeFileAtomic } from "../util/index.js";
import { z } from "zod";
import { SnapshotMetaSchema } from "../snapshot/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { KEY_RE, SANDBOX_ID_RE } from "../util/index.js";
import { MAX_RECORD } from "./record-budget.js";
import type { SandboxRecord } from "./sandbox.js";

const ms = z.number().finite().nonnegative();
const limit = z.number().finite().nonnegative().nullable().optional();

const Egress = z.object({
  mode: z.enum(["deny", "allow", "list"]),
  allow: z.array(
    z.object({
      cidr: z.string().max(64),
      ports: z.array(z.tuple([z.number().int(), z.number().int()])).optional(),
    }),
  ),
  dns: z.boolean(),
});

const NetworkRecord = z.object({
  mode: z.enum(["none", "user", "netns"]),
  egress: Egress,
  expose: z.array(z.number().int().min(1).max(65535)),
  guestIp: z.string().max(64).nullable(),
  slot: z.number().int().nonnegative().nullable(),
  ports: z.record(z.string(), z.string().max(64)),
});

const PausedImage = z.object({
  pausedAt: z.string(),
  memory: z.string(),
  vmstate: z.string(),
  disk: z.string(),
  machine: SnapshotMetaSchema.shape.machine,
  nic: SnapshotMetaSchema.shape.nic,
  pending: z.object({ diff: z.string(), base: z.string() }).optional(),
});

export const SandboxRecordSchema: z.ZodType<SandboxRecord> = z.looseObject({
  format: z.literal(1),
  id: z.string().regex(SANDBOX_ID_RE),
  tag: z.string().regex(KEY_RE),
  pid: z.number().int().positive(),
  pidStartTime: z.number().int().nonnegative(),
  created: z.string().refine((s) => Number.isFinite(Date.parse(s)), "not a time"),
  timings: z.object({ launchMs: ms, restoreMs: ms, readyMs: ms, totalMs: ms }),
  fromPool: z.boolean(),
  timeoutMs: z.number().int().nonnegative().nullable().optional(),
  metadata: z.record(z.string(), z.string()).optional(),
  onIdle: z.enum(["kill", "pause"]).optional(),
  limits: z
    .object({ memoryMiB: limit, cpus: limit, pids: limit, diskMiB: limit, lifetimeMs: limit })
    .optional(),
  memoryFile: z.string().optional(),
  paused: PausedImage.optional(),
  owner: z.string().nullable().optional(),
  network: NetworkRecord.optional(),
  fanout: z
    .string()
    .regex(/^[a-z0-9-]{1,64}$/)
    .optional(),
  env: z.record(z.string().max(256), z.string().max(1 << 16)).optional(),
  deadline: z
    .string()
    .refine((s) => Number.isFinite(Date.parse(s)), "not a time")
    .nullable()
    .optional(),
  onDeadline: z.enum(["kill", "pause"]).optional(),
  e2b: z
    .object({
      secure: z.boolean(),
      autoResume: z.boolean().optional(),
      timeoutMs: z.number().int().nonnegative().optional(),
      allowInternetAccess: z.boolean().nullable().optional(),
      network: z
        .object({
          allowOut: z.array(z.string().max(256)).max(256).optional(),
          denyOut: z.array(z.string().max(256)).max(256).optional(),
        })
        .optional(),
    })
    .optional(),
});

/** What recovery found in a sandbox directory. */
export type LoadedRecord =
  | { kind: "ok"; record: SandboxRecord }
  /** No record: a fork (or a pre-started VMM) the daemon died before finishing. */
  | { kind: "missing" }
  /** A record that does not parse, or does not belong here. */
  | { kind: "corrupt"; reason: string };

/** Paths a record names that recovery, pause and kill act on. */
function pathsOf(r: SandboxRecord): string[] {
  const p = r.paused;
  return [
    ...(r.memoryFile ? [r.memoryFile] : []),
    ...(p ? [p.memory, p.vmstate, p.disk, ...(p.pending ? [p.pending.diff] : [])] : []),
  ];
}

/** Where a sandbox's record lives in its directory. */
const recordFile = (dir: string): string => join(dir, "sandbox.json");

/**
 * Writes `<dir>/sandbox.json` atomically (write, fsync, rename), readable by the daemon only,
 * compact. Never one recovery would refuse: a record over MAX_RECORD is not written (a
 * `payload_too_large` error; the inputs' bounds, RECORD_BUDGET, keep every real one under it).
 */
export async function saveRecord(dir: string, record: SandboxRecord): Promise<void> {
  const text = JSON.stringify(record) + "\n";
  if (text.length > MAX_RECORD)
    throw new ForkdError(
      "payload_too_large",
      `sandbox ${record.id}'s record would be ${text.length} bytes, over the ${MAX_RECORD} a restarted daemon reads: ` +
        "less metadata, env or network rules",
      { limit: MAX_RECORD },
    );
  await writeFileAtomic(recordFile(dir), text, 0o600);
}

/** Reads and checks `<dir>/sandbox.json` for sandbox `id`. */
export async function loadRecord(dir: string, id: string): Promise<LoadedRecord> {
  let raw: string;
  try {
    raw = await readFile(recordFile(dir), "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return { kind: "missing" };
    return { kind: "corrupt", reason: `unreadable: ${errorMessage(e)}` };
  }
  if (raw.length > MAX_RECORD) return { kind: "corrupt", reason: `larger than ${MAX_RECORD} bytes` };
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (e) {
    return { kind: "corrupt", reason: `not JSON: ${errorMessage(e)}` };
  }
  const r = SandboxRecordSchema.safeParse(json);
  if (!r.success) return { kind: "corrupt", reason: `invalid record: ${z.prettifyError(r.error)}` };
  const record = r.data;
  if (record.id !== id) return { kind: "corrupt", reason: `record of ${record.id}, not ${id}` };
  const outside = pathsOf(record).find((p) => !p.startsWith(`${dir}/`) || p.split("/").includes(".."));
  if (outside) return { kind: "corrupt", reason: `names a file outside its directory: ${outside}` };
  return { kind: "ok", record };
}
