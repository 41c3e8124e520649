/**
 * The REST API's request schemas: the one place requests are described. Handlers parse every
 * body and query with these before touching anything.
 */
import { z } from "zod";
import { TAG_RE, TEMPLATE_RE } from "../util/ids.js";
import { MAX_FORK } from "../sandbox/service.js";

export const Tag = z.string().regex(TAG_RE, "tag must match " + TAG_RE.source);
export const GuestPath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => p.startsWith("/"), "path must be absolute")
  .refine((p) => !p.includes("\0"), "path must not contain NUL");

export const CreateSnapshot = z.strictObject({
  tag: Tag,
  template: z.string().regex(TEMPLATE_RE).default("python"),
  warm: z
    .string()
    .max(64 * 1024)
    .nullish(),
  warm_eval: z
    .string()
    .max(1 << 20)
    .nullish(),
  memory_mib: z.number().int().min(128).max(65536).default(512),
  vcpus: z.number().int().min(1).max(32).default(1),
});

export const CreateSandboxes = z.strictObject({
  snapshot_tag: Tag,
  n: z.number().int().min(1).max(MAX_FORK).default(1),
});

const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "invalid environment variable name");

export const Exec = z.strictObject({
  cmd: z.union([
    z
      .array(z.string().max(1 << 16))
      .min(1)
      .max(4096),
    z
      .string()
      .min(1)
      .max(1 << 20),
  ]),
  env: z.record(EnvName, z.string().max(1 << 16)).optional(),
  cwd: GuestPath.optional(),
  timeout_ms: z
    .number()
    .int()
    .min(1)
    .max(24 * 3600 * 1000)
    .optional(),
  stdin: z
    .string()
    .max(16 << 20)
    .optional(),
});

export const Eval = z.strictObject({
  code: z.string().max(1 << 20),
  timeout_ms: z
    .number()
    .int()
    .min(1)
    .max(3600 * 1000)
    .default(30_000),
});

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
export const Mkdir = z.strictObject({ path: GuestPath, parents: z.boolean().default(false) });
export const Rename = z.strictObject({ from: GuestPath, to: GuestPath });

export const truthy = (v: string | undefined): boolean => v === "1" || v === "true";
