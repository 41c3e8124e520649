/**
 * Where a guest image came from: one of forkd's templates, or an OCI image pulled by reference
 * (what a Dockerfile's FROM resolves to). Recorded in a snapshot's `source` (src/snapshot/meta.ts),
 * covered by its checksum: the schemas bound what a metadata file may say.
 */
import { z } from "zod";

export const TemplateSource = z.object({ kind: z.literal("template"), name: z.string().max(256) });

export const ImageSource = z.object({
  kind: z.literal("image"),
  /** The normalized reference it was pulled by (e.g. docker.io/library/python:3.11). */
  ref: z.string().max(1024),
  /** The digest of the (platform) manifest pulled: what the snapshot holds. */
  digest: z.string().max(256),
});

/** What a Dockerfile's FROM resolves to. */
export type BaseSource = z.infer<typeof TemplateSource> | z.infer<typeof ImageSource>;
