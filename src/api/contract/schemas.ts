/**
 * The REST API's schemas: the one place requests and responses are described. Handlers parse
 * every body and query with the request schemas before touching anything; the OpenAPI document
 * (./openapi.ts, committed as docs/openapi.json) is generated from all of them, and the SDKs'
 * types are generated from that document.
 *
 * Every schema that appears in the document under a name is registered in `contract` with its
 * id; unnamed ones are inlined where they are used.
 *
 * Every key on the wire is snake_case, in requests, replies and stream events alike (a unit test
 * walks the document for it). Records the daemon keeps on disk have their own shapes; they are
 * mapped to these in src/api/views/.
 */
import { z } from "zod";
import { KEY_RE, SANDBOX_ID_RE, TAG_RE, TEMPLATE_RE } from "../../util/index.js";
import { MAX_FORK } from "../../sandbox/index.js";
import { TenantName, TokenScope, TOKEN_ID_RE } from "../../access/index.js";
import { MAX_ALLOW_RULES, MAX_EXPOSE, MAX_PORTS_PER_RULE } from "../../net/index.js";
import { RECORD_BUDGET, jsonChars } from "../../sandbox/index.js";
import { ERROR_CODES } from "../../util/index.js";
import { EVAL_LANGUAGES } from "../../agent/index.js";
import { PTY_MAX } from "../../agent/index.js";
import { CONTEXT_ID_RE } from "../../agent/index.js";
import { CellEnv } from "../../app/index.js";
import { LIFECYCLE_EVENTS, WEBHOOK_ID_RE } from "../../webhooks/index.js";

export const contract = z.registry<{ id: string; description?: string }>();

function named<S extends z.ZodType>(schema: S, id: string, description?: string): S {
  contract.add(schema, description ? { id, description } : { id });
  return schema;
}

// ---------------------------------------------------------------- shared pieces

export const Tag = z
  .string()
  .regex(KEY_RE, "tag must match " + TAG_RE.source + ", or TENANT/TAG")
  .describe(
    "Snapshot tag: 1-64 characters, letters, digits, '_', '.', '-', not starting with a symbol; in the caller's namespace (a tenant's own, else a shared one). An admin names a tenant's as TENANT/TAG (docs/api.md, \"Tags and namespaces\").",
  );
export const SandboxId = z.string().regex(SANDBOX_ID_RE, "sandbox id must match " + SANDBOX_ID_RE.source);
export const GuestPath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => p.startsWith("/"), "path must be absolute")
  .refine((p) => !p.includes("\0"), "path must not contain NUL")
  .describe("Absolute path inside the guest.");

const MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000;
const Metadata = z
  .record(z.string().min(1).max(64), z.string().max(512))
  .refine((m) => Object.keys(m).length <= 32, "at most 32 metadata keys")
  .refine(
    (m) => jsonChars(m) <= RECORD_BUDGET.metadata,
    `at most ${RECORD_BUDGET.metadata >> 10} KiB of metadata in all (as JSON)`,
  )
  .describe("Free-form string labels kept with the sandbox (at most 32 keys, 32 KiB as JSON).");

const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "invalid environment variable name");
const SandboxEnv = z
  .record(EnvName.max(256), z.string().max(1 << 16))
  .refine((m) => Object.keys(m).length <= 256, "at most 256 variables")
  .refine(
    (m) => jsonChars(m) <= RECORD_BUDGET.env,
    `at most ${RECORD_BUDGET.env >> 10} KiB of variables in all (as JSON)`,
  )
  .describe(
    "Sandbox-wide environment (at most 256 variables, 64 KiB as JSON): every command and cell " +
      "sees it, under its own request's env.",
  );

/** The daemon's error codes (src/util/errors.ts): one list for the TypeScript type and the wire. */
export const ErrorCodeSchema = named(
  z
    .enum(ERROR_CODES)
    .describe(
      "Stable machine-readable code; each has one HTTP status: invalid_argument (400), not_found (404), " +
        "conflict (409), timeout (504), unavailable (503), guest_error (502), agent_protocol (502), " +
        "vmm_error (500), image_error (500), snapshot_corrupt (500), resource_exhausted (429), " +
        "unauthenticated (401), forbidden (403), payload_too_large (413), rate_limited (429, with " +
        "Retry-After), internal (500).",
    ),
  "ErrorCode",
);

export const ErrorEnvelope = named(
  z.object({
    error: z.object({
      code: ErrorCodeSchema,
      message: z.string(),
      details: z.record(z.string(), z.unknown()),
    }),
  }),
  "Error",
  "Every error response has this body.",
);

// ---------------------------------------------------------------- daemon

export const Health = named(
  z.object({
    ok: z.boolean(),
    accel: z.enum(["kvm", "tcg"]),
    accel_reason: z.string(),
    sandboxes: z.number().int(),
    pool: z.record(z.string(), z.number().int()).describe("Pre-started VMMs waiting, by snapshot tag."),
    pool_state: z
      .object({
        total: z.number().int(),
        hot: z.number().int().describe("Members restored, warmed and stopped ahead of forks."),
        cold: z.number().int(),
        max: z.number().int().describe("The host-wide bound (FORKD_POOL_MAX)."),
        max_mib: z.number().int().nullable().describe("The host-wide memory bound (FORKD_POOL_MAX_MIB)."),
        memory_mib: z.number().int().describe("The members' memory (PSS) when they joined."),
        tags: z.record(
          z.string(),
          z.object({
            ready: z.number().int(),
            hot: z.number().int(),
            target: z.number().int().describe("Members the policy gives the snapshot now."),
            score: z.number().describe("Its exponentially decayed fork count."),
          }),
        ),
      })
      .optional()
      .describe("The warm pool: totals, bounds and per snapshot (admins only)."),
    network: z
      .object({
        user: z.boolean(),
        netns: z.boolean(),
        slots: z.object({ free: z.number().int(), busy: z.number().int(), max: z.number().int() }).nullable(),
      })
      .optional()
      .describe("Which network modes this host gives, and its netns slots (admins only)."),
    cluster: z
      .object({
        nodes: z.number().int().describe("Live nodes (each with a record under its lease)."),
        etcd: z.boolean().describe("Whether the gateway's view of etcd is live."),
      })
      .optional()
      .describe("A cluster gateway's (forkd gateway; docs/cluster.md): absent on a daemon."),
  }),
  "Health",
);

export const Version = named(
  z.object({
    version: z.string(),
    api: z.literal("v1"),
    qemu: z.object({ binary: z.string(), version: z.string() }),
    accel: z.object({
      accel: z.enum(["kvm", "tcg"]),
      reason: z.string(),
      forced: z.boolean(),
      tsc_khz: z.number().describe("The host TSC frequency given to guests (kHz)"),
    }),
    started_at: z.string(),
    e2b: z
      .object({
        url: z.string().describe("Where E2B's API answers (E2B_API_URL and E2B_SANDBOX_URL)."),
        domain: z.string().nullable().describe("FORKD_E2B_DOMAIN (E2B_DOMAIN), if set."),
      })
      .nullable()
      .describe("E2B's API (FORKD_E2B_LISTEN); null: not served."),
  }),
  "Version",
);

const Machine = z
  .object({
    accel: z.enum(["kvm", "tcg"]),
    qemu: z.string().describe("QEMU's version"),
    cpu: z.string().describe("The CPU model guests see"),
  })
  .describe("What a snapshot restores on: device state loads only into the same machine.");

export const ClusterNode = named(
  z.object({
    id: z.string(),
    api: z.string().describe("Its REST listener, as gateways and peers reach it."),
    e2b: z.string().nullable().describe("Its E2B listener (null: not served)."),
    version: z.string(),
    started: z.string(),
    updated: z.string().describe("When its record was last written (it is rewritten as its load changes)."),
    draining: z.boolean().describe("A draining node takes no new work; its sandboxes run on."),
    machine: Machine,
    capacity: z.object({
      cores: z.number().int(),
      memory_mib: z.number().int(),
      free_memory_mib: z.number().int(),
      max_sandboxes: z.number().int().describe("FORKD_MAX_SANDBOXES"),
      running: z.number().int(),
      paused: z.number().int(),
    }),
    load: z.number().describe("(running + paused) / max_sandboxes"),
    holds: z
      .array(z.object({ tag: z.string(), digest: z.string(), warm: z.number().int() }))
      .describe("Snapshots it holds whole (store keys), with its warm pool members of each."),
  }),
  "ClusterNode",
  "A node of a cluster, as its record in etcd says (served by a gateway).",
);

export const NodeList = named(z.object({ nodes: z.array(ClusterNode) }), "NodeList");

// ---------------------------------------------------------------- access

export const TokenId = z.string().regex(TOKEN_ID_RE, "token id must match " + TOKEN_ID_RE.source);

export const Token = named(
  z.object({
    id: TokenId,
    tenant: z.string(),
    scope: z.enum(["admin", "tenant"]),
    created: z.string(),
    max_sandboxes: z.number().int().optional().describe("Sandboxes the tenant may hold at once."),
    max_memory_mib: z
      .number()
      .int()
      .optional()
      .describe("Cap on a snapshot's or build VM's memory_mib (absent: the operator's default)."),
    max_vcpus: z
      .number()
      .int()
      .optional()
      .describe("Cap on a snapshot's or build VM's vcpus (absent: the operator's default)."),
    max_build_disk_mib: z
      .number()
      .int()
      .optional()
      .describe("Cap on what one Dockerfile build's step layers hold (absent: the operator's default)."),
    kind: z.literal("e2b").optional().describe("e2b: an E2B API key; absent: a forkd token."),
  }),
  "Token",
  "An API token, without its secret (the daemon keeps only its sha256).",
);

export const TokenList = named(z.object({ tokens: z.array(Token) }), "TokenList");

export const CreateToken = named(
  z.strictObject({
    tenant: TenantName,
    scope: TokenScope.default("tenant"),
    max_sandboxes: z
      .number()
      .int()
      .min(0)
      .max(1_000_000)
      .optional()
      .describe("Sandboxes this tenant may hold at once through this token (default: no own limit)."),
    max_memory_mib: z
      .number()
      .int()
      .min(0)
      .max(65536)
      .optional()
      .describe(
        "Cap on memory_mib of the snapshots and Dockerfile builds this token makes (default: FORKD_TENANT_MAX_MEMORY_MIB).",
      ),
    max_vcpus: z
      .number()
      .int()
      .min(0)
      .max(32)
      .optional()
      .describe(
        "Cap on vcpus of the snapshots and Dockerfile builds this token makes (default: FORKD_TENANT_MAX_VCPUS).",
      ),
    max_build_disk_mib: z
      .number()
      .int()
      .min(0)
      .max(1 << 24)
      .optional()
      .describe(
        "Cap on what one Dockerfile build's step layers may hold on the host's disk (default: FORKD_TENANT_MAX_BUILD_DISK_MIB).",
      ),
    e2b: z
      .boolean()
      .optional()
      .describe("An E2B API key (`e2b_` + hex, what E2B's SDKs accept) instead of a forkd token."),
  }),
  "CreateToken",
);

export const TokenCreated = named(
  z.object({
    token: z.string().describe("The bearer token. Shown once: the daemon keeps only its sha256."),
    info: Token,
  }),
  "TokenCreated",
);

// ---------------------------------------------------------------- webhooks

export const WebhookId = z.string().regex(WEBHOOK_ID_RE, "webhook id must match " + WEBHOOK_ID_RE.source);

const WebhookEventName = z
  .enum(LIFECYCLE_EVENTS)
  .describe("A lifecycle event; sent as type sandbox.lifecycle.<event>");

export const Webhook = named(
  z.object({
    id: WebhookId,
    name: z.string(),
    url: z.string(),
    events: z.array(WebhookEventName),
    tenant: z.string().nullable().describe("Whose sandboxes it is told of; null: every one (an admin's)."),
    enabled: z.boolean(),
    created: z.string(),
    state: z
      .object({
        queued: z.number().int().describe("Events not delivered yet (kept across restarts)."),
        delivered: z.number().int(),
        failed_attempts: z.number().int(),
        dropped: z.number().int().describe("Given up (attempts exhausted) or pushed out of a full queue."),
        last_delivery_at: z.string().nullable(),
        last_error: z.string().nullable(),
        last_error_at: z.string().nullable(),
      })
      .describe("Delivery since the daemon started (queued: now)."),
  }),
  "Webhook",
);

export const WebhookList = named(z.object({ webhooks: z.array(Webhook) }), "WebhookList");

export const CreateWebhook = named(
  z.strictObject({
    url: z.string().max(2048).describe("http(s) URL POSTed each event. A tenant's must be a public address."),
    name: z.string().max(256).optional(),
    events: z
      .array(z.union([WebhookEventName, z.string().regex(/^sandbox\.lifecycle\.[a-z]+$/)]))
      .max(32)
      .optional()
      .describe(
        "Events to send (absent or empty: all); E2B's names (sandbox.lifecycle.created) are accepted.",
      ),
    secret: z
      .string()
      .min(16)
      .max(256)
      .optional()
      .describe("The signing secret (absent: one is generated and shown once)."),
    enabled: z.boolean().optional(),
  }),
  "CreateWebhook",
);

export const WebhookCreated = named(
  Webhook.extend({
    secret: z.string().describe("The signing secret. Shown once: GET never shows it."),
  }),
  "WebhookCreated",
);

// ---------------------------------------------------------------- snapshots

const ShellCommand = (what: string) =>
  z
    .string()
    .min(1)
    .max(64 * 1024)
    .nullish()
    .describe(what);

export const CreateSnapshot = named(
  z
    .strictObject({
      tag: Tag,
      template: z
        .string()
        .regex(TEMPLATE_RE)
        .optional()
        .describe("One of forkd's templates (default python, unless `image` is given)."),
      image: z
        .string()
        .min(1)
        .max(512)
        .regex(/^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$/, "an image reference: [HOST[:PORT]/]NAME[:TAG|@DIGEST]")
        .optional()
        .describe(
          "An OCI/Docker image reference ([HOST[:PORT]/]NAME[:TAG|@DIGEST]; Docker Hub short names " +
            "as docker does): the snapshot boots its tree, with its Env, WorkingDir and User.",
        ),
      start_cmd: ShellCommand(
        "Shell command started in the background in the parent before the warm-up and the freeze " +
          "(a server): it is already running in every child.",
      ),
      ready_cmd: ShellCommand(
        "Shell command run again and again (after start_cmd) until it exits 0, before the warm-up; " +
          "creation fails if it does not within ready_timeout_ms.",
      ),
      ready_timeout_ms: z
        .number()
        .int()
        .min(1000)
        .max(3_600_000)
        .default(120_000)
        .describe("How long ready_cmd has to succeed, from when start_cmd starts."),
      warm: z
        .string()
        .max(64 * 1024)
        .nullish()
        .describe("Shell command run in the parent before it is frozen."),
      warm_eval: z
        .string()
        .max(1 << 20)
        .nullish()
        .describe("Cell run in the parent's warm kernel (warm_eval_language) before it is frozen."),
      warm_eval_language: z
        .enum(EVAL_LANGUAGES)
        .default("python")
        .describe(
          "The warm kernel warm_eval runs in (docs/kernels.md); the image must have its interpreter.",
        ),
      memory_mib: z.number().int().min(128).max(65536).default(512),
      vcpus: z.number().int().min(1).max(32).default(1),
      nic: z
        .boolean()
        .default(true)
        .describe(
          "false: the parent and every child have no network device at all, so children can only " +
            "have network none (no device to emulate: a little less CPU and memory per child).",
        ),
    })
    .refine((b) => b.template === undefined || b.image === undefined, {
      message: "give at most one of template and image",
      path: ["image"],
    }),
  "CreateSnapshot",
);

export const SnapshotSource = named(
  z
    .discriminatedUnion("kind", [
      z.object({ kind: z.literal("template"), name: z.string() }),
      z.object({
        kind: z.literal("image"),
        ref: z.string().describe("The normalized reference it was pulled by"),
        digest: z.string().describe("The digest of the image manifest it holds"),
      }),
      z.object({
        kind: z.literal("dockerfile"),
        from: z.string().describe("FROM as the Dockerfile wrote it (build arguments substituted)"),
        base: z
          .discriminatedUnion("kind", [
            z.object({ kind: z.literal("template"), name: z.string() }),
            z.object({ kind: z.literal("image"), ref: z.string(), digest: z.string() }),
          ])
          .describe("What FROM resolved to: a template (forkd://NAME) or a pulled image"),
        key: z.string().describe("The last build step's cache key (the same key, the same root filesystem)"),
      }),
    ])
    .describe("Where a snapshot came from: a template, an image, a Dockerfile build."),
  "SnapshotSource",
);

/** POST /v1/snapshots/build: the options (query); the body is the build context as a tar. */
export const BuildSnapshotQuery = z.object({
  tag: Tag,
  dockerfile: z
    .string()
    .min(1)
    .max(4096)
    .default("Dockerfile")
    .describe("The Dockerfile's path inside the context."),
  build_args: z
    .string()
    .max(8192)
    .optional()
    .describe('Build arguments (ARG) as a JSON object of strings, e.g. {"VERSION":"1.2"}.'),
  warm: z.string().max(4096).optional().describe("Shell command run in the parent before it is frozen."),
  warm_eval: z
    .string()
    .max(8192)
    .optional()
    .describe("Cell run in the parent's warm kernel (warm_eval_language)."),
  warm_eval_language: z
    .enum(EVAL_LANGUAGES)
    .default("python")
    .describe("The warm kernel warm_eval runs in (docs/kernels.md)."),
  memory_mib: z.coerce.number().int().min(128).max(65536).default(512),
  vcpus: z.coerce.number().int().min(1).max(32).default(1),
  stream: z.enum(["0", "1"]).optional(),
});

const FileSum = z.object({ size: z.number().int(), sha256: z.string() });

/** Who owns a snapshot (tenant scoping). */
const SnapshotOwner = z
  .string()
  .nullable()
  .optional()
  .describe("The tenant that owns it; null or absent: shared (made by an admin), visible to every tenant.");

export const Snapshot = named(
  z.object({
    format: z.number().int(),
    tag: z.string(),
    template: z
      .string()
      .describe(
        "Its template; of a snapshot from an image or a Dockerfile, `image` or `dockerfile` (see source)",
      ),
    source: SnapshotSource,
    created: z.string(),
    status: z.enum(["ready"]),
    machine: z.object({
      memory_mib: z.number().int(),
      vcpus: z.number().int(),
      accel: z.enum(["kvm", "tcg"]),
      cpu: z.string(),
    }),
    image: z.object({
      hash: z.string(),
      dir: z.string(),
      kernel_version: z.string(),
      content: z.string().optional(),
    }),
    qemu: z.object({ binary: z.string(), version: z.string() }),
    warm: z.string().nullable(),
    warm_eval: z.string().nullable(),
    warm_eval_language: z
      .enum(EVAL_LANGUAGES)
      .nullable()
      .optional()
      .describe("The kernel warm_eval ran in (null: no warm_eval)"),
    disk_size: z.number().int().describe("Virtual size of the root disk in bytes"),
    files: z
      .object({
        memory: FileSum,
        vmstate: FileSum,
        disk: FileSum,
        memory_diff: FileSum.optional().describe(
          "A diff snapshot's own memory: the pages it differs by from memory_base's image (memory)",
        ),
      })
      .describe("memory: the RAM image a child maps (of a diff snapshot: its memory base's image)"),
    timings: z.object({ boot_ms: z.number(), warm_ms: z.number(), freeze_ms: z.number() }),
    state_format: z.enum(["migration", "devices"]).optional(),
    parent: z
      .object({ tag: z.string(), checksum: z.string() })
      .nullable()
      .optional()
      .describe("A branch's parent snapshot: its disk layer is stacked on the parent's."),
    memory_base: z
      .object({ tag: z.string(), checksum: z.string() })
      .optional()
      .describe(
        "A diff snapshot (format 3): the snapshot whose full memory image its diff is relative to, and that image's sha256",
      ),
    branch: z
      .object({
        sandbox: z.string(),
        pause_ms: z.number(),
        private_bytes: z.number().int(),
        finish_ms: z.number(),
      })
      .optional()
      .describe("A branch: the sandbox it was taken from and what its pause cost."),
    owner: SnapshotOwner,
    nic: z
      .object({
        mac: z.string(),
        addr: z.string(),
        prefix: z.number().int(),
        gateway: z.string(),
        dns: z.string(),
        gateway_mac: z.string(),
        link_up: z.boolean(),
      })
      .optional()
      .describe(
        "The guest's network device and fixed configuration, the same in every child. Absent in " +
          "snapshots made before networking: their children can only have network none.",
      ),
    checksum: z.string(),
  }),
  "Snapshot",
);

export const SnapshotStatus = named(
  z.object({
    tag: z.string(),
    status: z.enum(["writing", "failed"]),
    started: z.string(),
    source: z.string().nullable().describe("The sandbox it is branched from"),
    error: z.object({ code: ErrorCodeSchema, message: z.string() }).nullable(),
    owner: SnapshotOwner,
  }),
  "SnapshotStatus",
  "A snapshot that is not ready: being written in the background, or failed (its files removed).",
);

export const SnapshotList = named(
  z.object({
    snapshots: z.array(Snapshot),
    pending: z.array(SnapshotStatus).describe("Snapshots being written, or failed."),
  }),
  "SnapshotList",
);

export const SnapshotInfo = named(
  z.object({
    tag: z.string(),
    depth: z.number().int().describe("Snapshots below it in its chain (0: a cold-booted base)"),
    ancestors: z.array(z.string()).describe("Its parent, the parent's parent, ... (nearest first)"),
    dependents: z.array(z.string()).describe("Branches stacked directly on it"),
    logical_bytes: z.number().int().describe("What a child sees: guest RAM plus disk size"),
    physical_bytes: z.number().int().describe("Host disk its own files use"),
  }),
  "SnapshotInfo",
);

export const SnapshotOrStatus = named(z.union([Snapshot, SnapshotStatus]), "SnapshotOrStatus");

/**
 * A progress line of a streamed long operation: `message` for people; the optional fields when
 * the operation knows them (src/util/progress.ts), for a client to draw phases and bytes.
 */
const ProgressLine = z.object({
  type: z.literal("progress"),
  message: z.string(),
  phase: z
    .string()
    .optional()
    .describe(
      "What it is doing. Create: image, boot, warm, freeze, ready. Push: stage, upload, manifest. " +
        "Pull: manifest, download, receive, verify, register.",
    ),
  layer: z
    .object({
      index: z.number().int().describe("1-based"),
      count: z.number().int(),
      path: z.string().describe("The file's path in the pack"),
    })
    .optional()
    .describe("The file (layer) this line is about"),
  done_bytes: z.number().int().optional().describe("Bytes done so far in this phase"),
  total_bytes: z.number().int().optional().describe("Bytes the phase has in all, when known"),
});

export const SnapshotProgressEvent = named(
  z.discriminatedUnion("type", [
    ProgressLine,
    z.object({ type: z.literal("done"), snapshot: Snapshot }),
    ErrorEnvelope.extend({ type: z.literal("error") }),
  ]),
  "SnapshotProgressEvent",
  "One line of POST /v1/snapshots?stream=1.",
);

export const Deleted = named(
  z.object({
    deleted: z.string(),
    cascaded: z.array(z.string()).optional().describe("Snapshots deleted with it (cascade)"),
    orphaned: z
      .array(z.string())
      .optional()
      .describe("Dependents made independent of it (force): they still fork"),
  }),
  "Deleted",
);

export const DeleteSnapshotQuery = z.object({
  cascade: z.enum(["0", "1", "true", "false"]).optional(),
  force: z.enum(["0", "1", "true", "false"]).optional(),
  dry_run: z
    .enum(["0", "1", "true", "false"])
    .optional()
    .describe("Say what the delete would remove (DeletePlan) without removing anything."),
});

export const Unpacked = named(
  z.object({
    tag: z.string().describe("The pack's snapshot"),
    published: z
      .array(z.string())
      .describe("Tags registered by this unpack (a shared base already here is not)"),
  }),
  "Unpacked",
);

const RegistryRefText = z
  .string()
  .min(1)
  .max(512)
  .describe("HOST[:PORT]/NAME[:TAG] or HOST[:PORT]/NAME@sha256:<hex>; the host is never implied");
const Insecure = z
  .boolean()
  .default(false)
  .describe("Allow plain http to a registry (or pack URL) that is not on loopback");

export const Push = named(
  z.strictObject({ ref: RegistryRefText, insecure: Insecure }),
  "Push",
  "Where to push a snapshot (its whole chain and guest image) as an OCI artifact.",
);

export const Pushed = named(
  z.object({
    tag: z.string(),
    ref: z.string().describe("The reference pushed to"),
    digest: z.string().describe("Digest of the manifest pushed: pull by HOST/NAME@DIGEST"),
    blobs: z.object({
      total: z.number().int().describe("Files of the pack (one blob each)"),
      uploaded: z.number().int(),
      mounted: z.number().int().describe("Mounted from another repository of the same registry"),
      skipped: z.number().int().describe("Already in the repository: not uploaded"),
    }),
    bytes: z.object({
      uploaded: z.number().int().describe("Compressed bytes uploaded"),
      skipped: z.number().int().describe("Compressed bytes of blobs mounted or already there"),
    }),
  }),
  "Pushed",
);

export const Pull = named(
  z
    .strictObject({
      ref: RegistryRefText.optional(),
      url: z
        .string()
        .max(4096)
        .optional()
        .describe("A pack file (forkd pack) at an https URL (http on loopback, or with insecure)"),
      peer: z
        .union([z.string().max(4096), z.array(z.string().max(4096)).min(1).max(16)])
        .optional()
        .describe(
          "A peer forkd node's URL (http or https), or several (holders, best first: a file that fails on one " +
            "resumes on the next): pull snapshot `tag` (a store key, e.g. alice/app) with its chain and guest " +
            "image, under the same keys and owners; needs the cluster secret (FORKD_CLUSTER_SECRET_FILE) on both nodes",
        ),
      tag: Tag.optional().describe(
        "Register the pulled snapshot under this tag (its ancestors keep theirs); with peer: the key to pull",
      ),
      insecure: Insecure,
    })
    .refine(
      (b) => [b.ref, b.url, b.peer].filter((x) => x !== undefined).length === 1,
      "give exactly one of ref, url and peer",
    )
    .refine(
      (b) => b.peer === undefined || b.tag !== undefined,
      "a pull from a peer names the key to pull (tag)",
    ),
  "Pull",
);

export const Pulled = named(
  z.object({
    tag: z.string().describe("The snapshot pulled, as registered here"),
    published: z
      .array(z.string())
      .describe("Tags registered by this pull (a shared base already here is not)"),
    source: z.string().describe("The reference or URL pulled"),
    digest: z.string().nullable().describe("The manifest's digest (null for a URL)"),
    blobs: z.object({
      total: z.number().int(),
      downloaded: z.number().int(),
      reused: z.number().int().describe("Files this host had: not downloaded"),
    }),
    bytes: z.object({
      downloaded: z.number().int().describe("Bytes received over the wire (a registry's: compressed)"),
      files: z
        .array(z.object({ path: z.string(), bytes: z.number().int() }))
        .optional()
        .describe("Bytes received per file downloaded, by its path in the chain's layout"),
    }),
  }),
  "Pulled",
);

export const TransferProgressEvent = named(
  z.discriminatedUnion("type", [
    ProgressLine,
    z.object({ type: z.literal("done"), result: z.union([Pushed, Pulled]) }),
    ErrorEnvelope.extend({ type: z.literal("error") }),
  ]),
  "TransferProgressEvent",
  "One line of a push or pull with ?stream=1.",
);

export const Compact = named(
  z.strictObject({ tag: Tag.describe("Tag of the new, flattened snapshot") }),
  "Compact",
);

// ---------------------------------------------------------------- sandboxes

export const SandboxLimits = named(
  z.strictObject({
    memory_mib: z
      .number()
      .int()
      .min(64)
      .max(1 << 20)
      .optional()
      .describe(
        "Host memory of the sandbox's VMM process (pages its guest wrote, QEMU itself). Past it the host kills the VMM; exit_reason says so. Default: guest RAM + 384 MiB.",
      ),
    cpus: z
      .number()
      .min(0.01)
      .max(1024)
      .optional()
      .describe("CPU quota in cores (0.5: half of one core's time). Default: no quota."),
    pids: z
      .number()
      .int()
      .min(16)
      .max(65536)
      .optional()
      .describe(
        "Processes of the guest workload (commands, the interpreter, all they start): a fork bomb fails with EAGAIN inside the sandbox, which stays usable. Default 1024.",
      ),
    disk_mib: z
      .number()
      .int()
      .min(1)
      .max(1 << 24)
      .optional()
      .describe(
        "Host disk the sandbox's own disk layers may take: what it wrote since its fork (also in layers its branches froze). Past it the host kills the sandbox; exit_reason says so. Default: bounded only by the snapshot's disk size.",
      ),
    lifetime_ms: z
      .number()
      .int()
      .min(1000)
      .max(30 * 24 * 3600 * 1000)
      .optional()
      .describe(
        "The host kills the sandbox this long after its creation, whether in use, idle or paused (ends_at in its view); exit_reason says so. Independent of the idle timeout. Default: none.",
      ),
  }),
  "SandboxLimits",
  "Host-side limits of one sandbox (its VMM's cgroup). Guest vCPUs and RAM come from its snapshot.",
);

const Port = z.number().int().min(1).max(65535);

export const EgressRequest = named(
  z
    .strictObject({
      mode: z.enum(["deny", "allow", "list"]),
      allow: z
        .array(
          z.strictObject({
            cidr: z.string().max(18).describe('IPv4 network, e.g. "203.0.113.0/24" (a bare address is /32)'),
            ports: z
              .array(z.union([Port, z.string().regex(/^\d{1,5}-\d{1,5}$/)]))
              .min(1)
              .max(MAX_PORTS_PER_RULE)
              .optional()
              .describe('TCP and UDP ports or ranges ("8000-8100"); absent: everything'),
          }),
        )
        .max(MAX_ALLOW_RULES)
        .optional()
        .describe('The allow-list (mode "list")'),
      dns: z
        .boolean()
        .optional()
        .describe(
          'Whether the guest\'s resolver answers (default: yes for "allow", no for "list"; never for "deny")',
        ),
    })
    .describe(
      "What the guest may reach. Never the host's own services or other sandboxes, except a host " +
        "address listed as a /32.",
    ),
  "EgressRequest",
);

export const NetworkRequest = named(
  z
    .strictObject({
      mode: z
        .enum(["none", "user", "netns"])
        .default("none")
        .describe(
          "none: no connectivity (link down). user: QEMU user-mode networking. netns: the VMM in its " +
            "own network namespace with a tap, NAT and the egress policy enforced on the host.",
        ),
      egress: EgressRequest.optional().describe("What the guest may reach (default: allow)."),
      expose: z
        .array(Port)
        .max(MAX_EXPOSE)
        .optional()
        .describe("Guest TCP ports reachable from the host (see the sandbox's network.ports)."),
    })
    .describe("A child's network. The guest always has the same address (10.0.2.15)."),
  "NetworkRequest",
);

export const CreateSandboxes = named(
  z.strictObject({
    snapshot_tag: Tag,
    n: z.number().int().min(1).max(MAX_FORK).default(1),
    timeout_ms: z
      .number()
      .int()
      .min(1000)
      .max(MAX_TIMEOUT_MS)
      .nullish()
      .describe("Idle timeout: the daemon kills a child no API call has used for this long."),
    metadata: Metadata.optional(),
    on_idle: z
      .enum(["kill", "pause"])
      .default("kill")
      .describe("What the idle timeout does: kill the sandbox, or pause it (resume brings it back)."),
    limits: SandboxLimits.optional(),
    network: NetworkRequest.optional(),
    env: SandboxEnv.optional(),
    deadline_ms: z
      .number()
      .int()
      .min(1000)
      .max(MAX_TIMEOUT_MS)
      .nullish()
      .describe(
        "Absolute timeout (E2B's): the daemon does on_deadline this long after creation, in use or not.",
      ),
    on_deadline: z
      .enum(["kill", "pause"])
      .default("kill")
      .describe("What the deadline does: kill the sandbox, or pause it."),
  }),
  "CreateSandboxes",
);

export const SandboxNetwork = named(
  z.object({
    mode: z.enum(["none", "user", "netns"]),
    guest_ip: z.string().nullable(),
    egress: z
      .object({
        mode: z.enum(["deny", "allow", "list"]),
        allow: z.array(
          z.object({ cidr: z.string(), ports: z.array(z.union([z.number().int(), z.string()])).optional() }),
        ),
        dns: z.boolean(),
      })
      .nullable(),
    ports: z
      .array(z.object({ port: z.number().int(), host: z.string().describe('"host:port" where it answers') }))
      .describe("Exposed guest ports, while the sandbox runs."),
  }),
  "SandboxNetwork",
);

export const Sandbox = named(
  z.object({
    id: z.string(),
    tag: z.string(),
    pid: z.number().int(),
    state: z
      .enum(["running", "paused", "exited", "lost"])
      .describe(
        "lost: its node left a cluster (died or was cut off); a gateway answers it from etcd " +
          "(exit_reason says why, node where it ran).",
      ),
    created: z.string(),
    exit_reason: z.string().nullable(),
    timings: z.object({
      launch_ms: z.number(),
      restore_ms: z.number(),
      ready_ms: z.number(),
      total_ms: z.number(),
    }),
    from_pool: z.boolean(),
    timeout_ms: z.number().int().nullable(),
    expires_at: z.string().nullable().describe("When the idle timeout kills it, unless it is used before."),
    deadline: z
      .string()
      .nullable()
      .describe("When its absolute timeout (deadline_ms) does on_deadline, in use or not; null: none."),
    on_deadline: z.enum(["kill", "pause"]).describe("What the deadline does."),
    ends_at: z
      .string()
      .nullable()
      .describe("When its lifetime (limits.lifetime_ms) ends and the host kills it."),
    metadata: z.record(z.string(), z.string()),
    owner: z.string().nullable().describe("The tenant whose token created it; null: an admin."),
    node: z
      .string()
      .nullable()
      .describe(
        "The cluster node it runs on (FORKD_NODE_ID); null: the daemon runs alone, not in a cluster.",
      ),
    limits: z
      .object({
        memory_mib: z.number().int().nullable(),
        cpus: z.number().nullable(),
        pids: z.number().int().nullable(),
        disk_mib: z.number().int().nullable(),
        lifetime_ms: z.number().int().nullable(),
      })
      .describe("The host-side limits in force (null: not limited, or the host has no cgroups)."),
    network: SandboxNetwork,
  }),
  "Sandbox",
);

export const SandboxList = named(
  z.object({
    sandboxes: z.array(Sandbox),
    next_token: z
      .string()
      .nullable()
      .describe("Where the next page starts (pass it as ?next_token=); null on the last page."),
  }),
  "SandboxList",
);

export const ListSandboxesQuery = z.object({
  state: z
    .string()
    .regex(
      /^(running|paused|exited|lost)(,(running|paused|exited|lost))*$/,
      "state: running, paused, exited, lost, comma-separated",
    )
    .optional()
    .describe("Only sandboxes in one of these states (comma-separated)."),
  metadata: z
    .string()
    .max(8192)
    .optional()
    .describe("Only sandboxes whose metadata has every pair: URL-encoded k=v&k2=v2, as E2B's SDKs send it."),
  limit: z.coerce.number().int().min(1).max(1000).optional().describe("Page size (default: every sandbox)."),
  next_token: z.string().max(256).optional().describe("The next_token of the previous page."),
});

export const MetricsQuery = z.object({
  start: z.string().max(64).optional().describe("ISO time; samples before it are left out."),
  end: z.string().max(64).optional().describe("ISO time; samples after it are left out."),
});

export const SandboxMetrics = named(
  z.object({
    metrics: z.array(
      z.object({
        timestamp: z.string(),
        cpu_used_pct: z
          .number()
          .describe("CPU the VM used since the previous sample (or its start), % of its vCPUs"),
        cpu_count: z.number().int(),
        mem_used: z.number().int().describe("Bytes of host memory the VM holds on its own (private)"),
        mem_total: z.number().int().describe("The guest's memory in bytes"),
        disk_used: z.number().int().describe("Bytes its disk layers took since its fork"),
        disk_total: z.number().int().describe("Its disk limit in bytes (0: none)"),
      }),
    ),
  }),
  "SandboxMetrics",
  "Host-side usage of a sandbox's VM, E2B's metrics shape (one sample: now).",
);

export const ForkResult = named(
  z.object({
    sandboxes: z.array(Sandbox),
    failures: z.array(z.object({ index: z.number().int(), code: ErrorCodeSchema, message: z.string() })),
  }),
  "ForkResult",
  "Children that answered, and those that failed (cleaned up) without failing their siblings.",
);

export const Branch = named(
  z.strictObject({
    tag: Tag.optional().describe("Tag of the new snapshot (default: br-<random>)"),
    wait: z
      .boolean()
      .default(true)
      .describe("Return when the snapshot is ready (201); false: as soon as the source runs again (202)."),
  }),
  "Branch",
);

export const BranchResult = named(
  z.object({
    tag: z.string(),
    status: z.enum(["ready", "writing"]),
    pause_ms: z.number().describe("How long the source was paused"),
    private_bytes: z
      .number()
      .int()
      .describe("Memory the source had written since its fork (copied in the pause)"),
    snapshot: Snapshot.nullable(),
  }),
  "BranchResult",
);

export const ExposePort = named(
  z.strictObject({
    port: z.number().int().min(1).max(65535).describe("A guest TCP port"),
  }),
  "ExposePort",
  "A guest TCP port to make reachable from the host.",
);

export const SetTimeout = named(
  z.strictObject({
    timeout_ms: z.number().int().min(1000).max(MAX_TIMEOUT_MS).nullable(),
  }),
  "SetTimeout",
  "A new idle timeout counted from now; null removes it.",
);

export const SetDeadline = named(
  z.strictObject({
    deadline_ms: z.number().int().min(0).max(MAX_TIMEOUT_MS).nullable(),
  }),
  "SetDeadline",
  "A new absolute deadline, this long from now (0: at once); null removes it.",
);

// ---------------------------------------------------------------- commands

const PtyDim = z.number().int().min(1).max(PTY_MAX);
export const PtySize = named(z.strictObject({ rows: PtyDim, cols: PtyDim }), "PtySize", "A terminal's size.");

export const Exec = named(
  z.strictObject({
    cmd: z
      .union([
        z
          .array(z.string().max(1 << 16))
          .min(1)
          .max(4096),
        z
          .string()
          .min(1)
          .max(1 << 20),
      ])
      .describe("argv (run directly) or a string (run by /bin/sh -c)."),
    env: z.record(EnvName, z.string().max(1 << 16)).optional(),
    cwd: GuestPath.optional(),
    user: z
      .string()
      .regex(/^[^:\s]{1,256}(:[^:\s]{1,256})?$/, "user must be name, uid, name:group or uid:gid")
      .optional()
      .describe(
        "Run as this user of the image: name, uid, name:group or uid:gid (from the image's " +
          "/etc/passwd and /etc/group; root always works). Default: the image's user (root for templates).",
      ),
    timeout_ms: z
      .number()
      .int()
      .min(1)
      .max(24 * 3600 * 1000)
      .optional()
      .describe("Kills the command's whole process group after this long."),
    stdin: z
      .string()
      .max(16 << 20)
      .optional()
      .describe("Written to the command's standard input, which is then closed (unless keep_stdin_open)."),
    keep_stdin_open: z
      .boolean()
      .default(false)
      .describe("Leave standard input open for POST .../commands/{pid}/stdin."),
    pty: PtySize.optional().describe(
      "Run on a pseudo-terminal of this size: stdin, stdout and stderr are the terminal, all output " +
        "arrives as stdout, standard input stays open (keystrokes: POST .../commands/{pid}/stdin; " +
        "Ctrl-C is the byte 0x03), TERM is xterm-256color unless env sets it. Resize with " +
        "POST .../commands/{pid}/resize.",
    ),
  }),
  "Exec",
);

export const ExecResult = named(
  z.object({
    exit_code: z.number().int().nullable(),
    signal: z.number().int().nullable(),
    timed_out: z.boolean(),
    stdout: z.string(),
    stderr: z.string(),
    stdout_truncated: z.boolean(),
    stderr_truncated: z.boolean(),
    duration_ms: z.number(),
  }),
  "ExecResult",
);

export const ExecEvent = named(
  z.discriminatedUnion("type", [
    z.object({ type: z.literal("started"), pid: z.number().int() }),
    z.object({ type: z.literal("stdout"), data: z.string().describe("base64") }),
    z.object({ type: z.literal("stderr"), data: z.string().describe("base64") }),
    z.object({
      type: z.literal("exit"),
      exit_code: z.number().int().nullable(),
      signal: z.number().int().nullable(),
      timed_out: z.boolean(),
      duration_ms: z.number(),
    }),
    ErrorEnvelope.extend({ type: z.literal("error") }),
  ]),
  "ExecEvent",
  "One line of POST /v1/sandboxes/{id}/exec/stream.",
);

export const Command = named(
  z.object({
    pid: z.number().int(),
    cmd: z.union([z.array(z.string()), z.string()]),
    started: z.string(),
    stdin_open: z.boolean(),
    pty: z.boolean().describe("Runs on a pseudo-terminal (resizable)."),
    source: z
      .enum(["api", "terminal", "envd", "inherited"])
      .describe(
        "Which door started it: exec or exec/stream (api), the terminal, E2B's envd process API, or found running in the guest (inherited: a daemon restart, a branch's child).",
      ),
    tag: z.string().optional().describe("The tag E2B's envd Start gave it (process selector by tag)."),
  }),
  "Command",
  "A command the sandbox runs (started through any of the API's doors) that has not exited yet.",
);

export const CommandList = named(z.object({ commands: z.array(Command) }), "CommandList");

export const EndedCommand = named(
  z.object({
    pid: z.number().int(),
    cmd: z.union([z.array(z.string()), z.string()]),
    started: z.string(),
    ended: z.string(),
    exit_code: z
      .number()
      .int()
      .nullable()
      .describe("null: it was killed by `signal`, or lost with the sandbox."),
    signal: z.number().int().nullable(),
    timed_out: z.boolean(),
    pty: z.boolean(),
    source: z
      .enum(["api", "terminal", "envd", "inherited"])
      .describe(
        "Which door started it: exec or exec/stream (api), the terminal, E2B's envd process API, or found running in the guest (inherited: a daemon restart, a branch's child).",
      ),
    tag: z.string().optional().describe("The tag E2B's envd Start gave it (process selector by tag)."),
  }),
  "EndedCommand",
  "A command the sandbox ran (started through any of the API's doors) that has ended.",
);

export const CommandHistory = named(
  z.object({ commands: z.array(EndedCommand).describe("Oldest first; the last 256 (kept in memory).") }),
  "CommandHistory",
);

export const SIGNALS = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGKILL: 9,
  SIGUSR1: 10,
  SIGUSR2: 12,
  SIGTERM: 15,
};

export const SendSignal = named(
  z.strictObject({
    signal: z
      .union([z.enum(Object.keys(SIGNALS) as [keyof typeof SIGNALS]), z.number().int().min(1).max(64)])
      .default("SIGKILL"),
  }),
  "SendSignal",
);

export const PidParam = z.object({
  id: SandboxId,
  pid: z.coerce
    .number()
    .int()
    .min(1)
    .max(2 ** 31 - 1),
});
export const StdinQuery = z.object({ eof: z.enum(["0", "1", "true", "false"]).optional() });

// ---------------------------------------------------------------- code cells

const ContextId = z
  .string()
  .regex(CONTEXT_ID_RE, "a context id is 'default' or 16 hex digits")
  .describe("A code context of a kernel: 'default' or the id its creation returned.");
export const Eval = named(
  z.strictObject({
    code: z.string().max(1 << 20),
    language: z
      .enum(EVAL_LANGUAGES)
      .default("python")
      .describe("The warm kernel that runs the cell; one the image cannot run is `unavailable` (503)."),
    timeout_ms: z
      .number()
      .int()
      .min(1)
      .max(3600 * 1000)
      .default(30_000),
    context_id: ContextId.optional().describe(
      "The code context of that kernel the cell runs in (POST .../contexts); absent: its default one.",
    ),
    env: CellEnv.optional().describe(
      "Variables the cell sees, over the sandbox's own env; the kernel's environment is restored after it.",
    ),
  }),
  "Eval",
);

export const EvalEvent = named(
  z.discriminatedUnion("type", [
    z.object({ type: z.literal("stdout"), text: z.string() }),
    z.object({ type: z.literal("stderr"), text: z.string() }),
    z.object({ type: z.literal("result"), result: z.lazy(() => EvalResult) }),
    ErrorEnvelope.extend({ type: z.literal("error") }),
  ]),
  "EvalEvent",
);

export const CodeContext = named(
  z.object({
    id: ContextId,
    language: z.enum(EVAL_LANGUAGES),
    cwd: z.string().describe("The directory its cells start in (a cell's chdir carries over to the next)."),
  }),
  "CodeContext",
);
export const CreateContext = named(
  z.strictObject({
    language: z.enum(EVAL_LANGUAGES).default("python"),
    cwd: z
      .string()
      .min(1)
      .max(4096)
      .optional()
      .describe("An existing directory in the guest; absent: the kernel's (the image's default cwd)."),
  }),
  "CreateContext",
);
export const ContextParam = z.object({ id: SandboxId, context: ContextId });
export const ContextQuery = z.object({ language: z.enum(EVAL_LANGUAGES).default("python") });

const MimeBundle = named(
  z
    .record(z.string(), z.unknown())
    .describe(
      "MIME type to data: text for text/*, base64 for images, any JSON for application/json " +
        '(e.g. {"image/png": "iVBOR...", "text/plain": "<Figure 1>"}).',
    ),
  "MimeBundle",
);

export const EvalResult = named(
  z.object({
    ok: z.boolean(),
    value: z.string().nullable().describe("repr() of the cell's final expression, if it has one."),
    value_data: MimeBundle.nullable().describe(
      "Rich forms of the final value (its _repr_html_, _repr_png_, ...; a matplotlib figure as PNG).",
    ),
    display: z
      .array(MimeBundle)
      .describe("Objects passed to display() and figures the cell left open, in order."),
    stdout: z.string(),
    stderr: z.string(),
    error: z.object({ name: z.string(), value: z.string(), traceback: z.string() }).nullable(),
    context: z
      .string()
      .nullable()
      .describe("The context the cell ran in (null: a guest agent older than contexts)."),
    execution_count: z.number().int().nullable().describe("The cell's number in its context."),
  }),
  "EvalResult",
);

// ---------------------------------------------------------------- files

export const PathQuery = z.object({ path: GuestPath });
export const WriteQuery = z.object({
  path: GuestPath,
  mode: z.coerce.number().int().min(0).max(0o7777).optional(),
  parents: z.enum(["0", "1", "true", "false"]).optional(),
});
export const RemoveQuery = z.object({
  path: GuestPath,
  recursive: z.enum(["0", "1", "true", "false"]).optional(),
});
export const Mkdir = named(z.strictObject({ path: GuestPath, parents: z.boolean().default(false) }), "Mkdir");
export const Rename = named(z.strictObject({ from: GuestPath, to: GuestPath }), "Rename");

const StatFields = {
  type: z.enum(["file", "dir", "symlink", "other"]),
  size: z.number().int(),
  mode: z.number().int(),
  mtime_ms: z.number().describe("Last modification, ms since the epoch"),
};
export const FileStat = named(z.object({ path: z.string(), ...StatFields }), "FileStat");
export const DirList = named(
  z.object({ path: z.string(), entries: z.array(z.object({ name: z.string(), ...StatFields })) }),
  "DirList",
);
export const FileWritten = named(z.object({ path: z.string(), size: z.number().int() }), "FileWritten");
export const PathResult = named(z.object({ path: z.string() }), "PathResult");
export const Renamed = named(z.object({ from: z.string(), to: z.string() }), "Renamed");

export const WatchQuery = z.object({
  path: GuestPath,
  recursive: z.enum(["0", "1", "true", "false"]).optional(),
});
const WatchPathEvent = <T extends string>(type: T) =>
  z.object({
    type: z.literal(type),
    path: z.string().describe("Absolute path in the sandbox"),
    is_dir: z.boolean(),
  });
export const WatchLine = named(
  z.discriminatedUnion("type", [
    z
      .object({ type: z.literal("ready") })
      .describe("The watch is in place: changes from now on are reported."),
    WatchPathEvent("create"),
    WatchPathEvent("write"),
    WatchPathEvent("remove"),
    WatchPathEvent("rename").describe("Moved away from `path` (its new name, if watched, is a create)."),
    WatchPathEvent("chmod"),
    WatchPathEvent("overflow").describe(
      "Events were dropped (the client read too slowly, or a limit): `path` is the watched directory.",
    ),
    z.object({ type: z.literal("end") }).describe("The watched directory was removed or moved away."),
    ErrorEnvelope.extend({ type: z.literal("error") }),
  ]),
  "WatchLine",
  "One line of GET /v1/sandboxes/{id}/files/watch.",
);

export const truthy = (v: string | undefined): boolean => v === "1" || v === "true";

// ---------------------------------------------------------------- the web console

const Digits = (max: number, what: string) =>
  z
    .string()
    .regex(/^\d{1,9}$/, `${what} must be a whole number`)
    .refine((v) => Number(v) <= max, `${what} is at most ${max}`);

export const TerminalQuery = z.object({
  rows: Digits(PTY_MAX, "rows")
    .refine((v) => Number(v) >= 1, "rows is at least 1")
    .optional(),
  cols: Digits(PTY_MAX, "cols")
    .refine((v) => Number(v) >= 1, "cols is at least 1")
    .optional(),
  cmd: z
    .string()
    .min(1)
    .max(1 << 16)
    .optional()
    .describe("Run by /bin/sh -c on the PTY (default: /bin/bash -l if the image has it, else /bin/sh)."),
});

export const CONSOLE_TAIL_DEFAULT = 64 << 10;
export const CONSOLE_TAIL_MAX = 1 << 20;
export const ConsoleTailQuery = z.object({
  tail_bytes: Digits(CONSOLE_TAIL_MAX, "tail_bytes")
    .optional()
    .describe(`Bytes from the end of the serial console log (default ${CONSOLE_TAIL_DEFAULT}).`),
});

export const AUDIT_LIMIT_DEFAULT = 100;
export const AUDIT_LIMIT_MAX = 1000;
export const AuditQuery = z.object({
  sandbox: SandboxId.optional().describe("Lines whose target names this sandbox."),
  snapshot: Tag.optional().describe("Lines whose target names this snapshot tag."),
  limit: Digits(AUDIT_LIMIT_MAX, "limit")
    .optional()
    .describe(`The newest lines, at most this many (default ${AUDIT_LIMIT_DEFAULT}).`),
});

export const AuditLine = named(
  z.object({
    ts: z.string(),
    request_id: z.string(),
    caller: z.string(),
    token: z.string().nullable(),
    tenant: z.string().nullable().describe("The tenant the caller was scoped to; null for an admin."),
    remote: z.string().nullable(),
    action: z.string(),
    target: z.record(z.string(), z.union([z.string(), z.array(z.string())])),
    status: z.number().int(),
    result: z.string(),
    duration_ms: z.number(),
  }),
  "AuditLine",
  "One audit log line (docs/operations.md, 'Audit log').",
);
export const AuditLines = named(z.object({ lines: z.array(AuditLine) }), "AuditLines", "Newest last.");

export const DeletePlan = named(
  z.object({
    tag: z.string(),
    dry_run: z.literal(true),
    deletes: z.array(z.string()).describe("Tags the delete would remove, in order"),
    orphaned: z.array(z.string()).describe("Dependents it would flatten to no longer need it (force)"),
    dependents: z
      .array(z.string())
      .describe("Branches stacked on it that refuse the delete (without cascade or force)"),
    sandboxes: z
      .array(z.string())
      .describe("Sandboxes (the caller may see) running from what it would remove: they refuse the delete"),
    refused: z.boolean().describe("Whether the real delete would be refused (409)"),
  }),
  "DeletePlan",
  "What DELETE /v1/snapshots/{tag} with the same options would do (?dry_run=1): nothing is removed.",
);

export const ConsoleLogin = named(
  z.strictObject({ token: z.string().min(1).max(512) }),
  "ConsoleLogin",
  "A bearer token, exchanged for the console's session cookie.",
);
export const ConsoleCaller = named(
  z.object({
    caller: z.object({
      kind: z.enum(["local", "token", "admin"]).describe("local: the unix socket (or `forkd console`)"),
      name: z.string(),
      tenant: z.string().nullable().describe("null: an admin (sees every tenant's sandboxes)"),
      admin: z.boolean(),
      token: z.string().nullable().describe("The token's id"),
    }),
  }),
  "ConsoleCaller",
);
export const ConsoleLoggedIn = named(
  ConsoleCaller.extend({
    key: z
      .string()
      .describe(
        "The session's key: sent as X-Forkd-Console-Key with every call; kept by the page, not in a cookie",
      ),
  }),
  "ConsoleLoggedIn",
);
export const ConsoleTicket = named(
  z.object({
    ticket: z.string().describe("Single use, 60 s: `?console_ticket=` on a GET or a WebSocket upgrade"),
  }),
  "ConsoleTicket",
);
