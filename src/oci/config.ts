/**
 * The image config blob (OCI image config / Docker container image v1): its platform, its
 * layers' uncompressed digests (rootfs.diff_ids) and the runtime settings forkd honours, zod
 * validated with bounds on every list and string.
 */
import { z } from "zod";
import { DIGEST_RE } from "../registry/index.js";
import { ForkdError } from "../util/index.js";
import type { ImageConfig } from "./image.js";

const MAX_STR = 32 << 10;
const str = z.string().max(MAX_STR);
const strList = z.array(str).max(4096).nullish();

const schema = z.object({
  architecture: z.string().max(64).optional(),
  os: z.string().max(64).optional(),
  config: z
    .object({
      Env: strList,
      WorkingDir: str.nullish(),
      User: str.nullish(),
      Entrypoint: strList,
      Cmd: strList,
      Labels: z.record(z.string().max(1024), str).nullish(),
    })
    .nullish(),
  rootfs: z.object({
    type: z.literal("layers"),
    diff_ids: z.array(z.string().regex(DIGEST_RE, "sha256:<64 hex digits>")).max(256),
  }),
});

export interface ParsedConfig {
  config: ImageConfig;
  diffIds: string[];
  platform: { os: string; architecture: string };
}

export function parseImageConfig(bytes: Buffer, what: string): ParsedConfig {
  let j: unknown;
  try {
    j = JSON.parse(bytes.toString("utf8"));
  } catch {
    throw new ForkdError("invalid_argument", `${what}: the image config is not JSON`);
  }
  const r = schema.safeParse(j);
  if (!r.success) {
    throw new ForkdError(
      "invalid_argument",
      `${what}: not a valid image config: ${z.prettifyError(r.error).slice(0, 300)}`,
    );
  }
  const c = r.data.config ?? {};
  const labels = c.Labels ?? {};
  if (Object.keys(labels).length > 4096) throw new ForkdError("invalid_argument", `${what}: too many labels`);
  const env = (c.Env ?? []).filter((e) => e.includes("=") && !e.includes("\0"));
  return {
    config: {
      env,
      workingDir: c.WorkingDir ? c.WorkingDir : null,
      user: c.User ? c.User : null,
      entrypoint: c.Entrypoint ?? null,
      cmd: c.Cmd ?? null,
      labels: { ...labels },
    },
    diffIds: r.data.rootfs.diff_ids,
    platform: { os: r.data.os ?? "", architecture: r.data.architecture ?? "" },
  };
}
