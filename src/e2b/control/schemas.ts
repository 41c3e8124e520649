/**
 * The bodies and queries of E2B's control plane that forkd reads, as its openapi (e2b-dev/infra
 * spec/openapi.yml) and its SDKs' generated types describe them. Unknown fields are ignored, as
 * E2B's server does; what forkd cannot do is refused where it is read (sandboxes.ts).
 */
import { z } from "zod";
import { RECORD_BUDGET, jsonChars } from "../../sandbox/index.js";

/** int32 seconds, as E2B's `timeout` fields. */
const Seconds = z
  .number()
  .int()
  .min(0)
  .max(2 ** 31 - 1);
const EnvName = z
  .string()
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "invalid environment variable name")
  .max(256);

// The totals keep a sandbox's record within what a restarted daemon reads (RECORD_BUDGET).
export const Metadata = z
  .record(z.string().min(1).max(256), z.string().max(4096))
  .refine((m) => Object.keys(m).length <= 64, "at most 64 metadata keys")
  .refine(
    (m) => jsonChars(m) <= RECORD_BUDGET.metadata,
    `at most ${RECORD_BUDGET.metadata >> 10} KiB of metadata in all (as JSON)`,
  );

export const EnvVars = z
  .record(EnvName, z.string().max(1 << 16))
  .refine((m) => Object.keys(m).length <= 256, "at most 256 variables")
  .refine(
    (m) => jsonChars(m) <= RECORD_BUDGET.env,
    `at most ${RECORD_BUDGET.env >> 10} KiB of variables in all (as JSON)`,
  );

/** allowOut or denyOut. */
const OutList = z
  .array(z.string().max(256))
  .max(256)
  .refine(
    (a) => jsonChars(a) <= RECORD_BUDGET.networkList,
    `at most ${RECORD_BUDGET.networkList >> 10} KiB of entries (as JSON)`,
  );

export const NetworkConfig = z.object({
  allowOut: OutList.optional(),
  denyOut: OutList.optional(),
  allowPublicTraffic: z.boolean().optional(),
  maskRequestHost: z.string().max(256).optional(),
  rules: z.record(z.string(), z.unknown()).optional(),
  egressProxy: z.unknown().optional(),
  httpsPorts: z.array(z.number().int()).optional(),
});
export type NetworkConfig = z.infer<typeof NetworkConfig>;

/** NewSandbox (POST /sandboxes) and NewSandboxV2 (POST /v2/sandboxes, always secure). */
export const NewSandbox = z.object({
  templateID: z.string().min(1).max(256),
  timeout: Seconds.optional(),
  autoPause: z.boolean().optional(),
  autoPauseMemory: z.boolean().optional(),
  autoResume: z.object({ enabled: z.boolean() }).optional(),
  secure: z.boolean().optional(),
  allow_internet_access: z.boolean().optional(),
  network: NetworkConfig.optional(),
  metadata: Metadata.nullish(),
  envVars: EnvVars.nullish(),
  mcp: z.record(z.string(), z.unknown()).nullish(),
  volumeMounts: z
    .array(z.object({ name: z.string(), path: z.string() }))
    .max(64)
    .optional(),
  iam: z.object({ tokens: z.record(z.string(), z.unknown()).optional() }).optional(),
});
export type NewSandbox = z.infer<typeof NewSandbox>;

/** PUT /sandboxes/{id}/network (SandboxNetworkUpdateConfig). */
export const NetworkUpdate = z.object({
  allow_internet_access: z.boolean().optional(),
  allowOut: OutList.optional(),
  denyOut: OutList.optional(),
  rules: z.record(z.string(), z.unknown()).optional(),
  egressProxy: z.unknown().optional(),
});

export const TimeoutBody = z.object({ timeout: Seconds });
export const ConnectBody = z.object({ timeout: Seconds.optional(), memory: z.boolean().optional() });
export const ResumeBody = z.object({
  timeout: Seconds.optional(),
  autoPause: z.boolean().optional(),
  memory: z.boolean().optional(),
});
export const RefreshBody = z.object({ duration: z.number().int().min(0).max(3600).optional() });
export const PauseBody = z.object({ memory: z.boolean().optional() });
export const ForkBody = z.object({
  count: z.number().int().min(1).max(100).optional(),
  timeout: Seconds.optional(),
});
export const SnapshotBody = z.object({ name: z.string().min(1).max(256).optional() });

/** GET /v2/sandboxes (and the v1 list's `metadata`). */
export const ListQuery = z.object({
  metadata: z
    .string()
    .max(16 << 10)
    .optional(),
  state: z.string().max(64).optional(),
  limit: z.coerce.number().int().min(1).max(100).optional(),
  nextToken: z.string().max(1024).optional(),
  order: z.enum(["asc", "desc"]).optional(),
  startedAfter: z.string().max(64).optional(),
  template: z.string().max(256).optional(),
});

export const SnapshotListQuery = z.object({
  sandboxID: z.string().max(64).optional(),
  name: z.string().max(256).optional(),
  limit: z.coerce.number().int().min(1).max(100).optional(),
  nextToken: z.string().max(1024).optional(),
});
