/**
 * Test-only image resolver: images named in a JSON file (FORKD_TEST_IMAGES=<file>: an object
 * of reference -> {digest, rootfs, config: {env, workingDir, user}}), so integration tests can
 * snapshot a root tree on the host without a registry. With the variable unset the daemon has
 * no such resolver; never set it in production (it serves any directory the file names).
 */
import { readFile } from "node:fs/promises";
import { z } from "zod";
import { ForkdError } from "../util/index.js";
import type { ImageResolver, RootfsImage } from "./rootfs-image.js";

const Entry = z.object({
  digest: z.string().regex(/^sha256:[0-9a-f]{64}$/),
  rootfs: z.string().startsWith("/"),
  config: z.object({
    env: z.array(z.string()),
    workingDir: z.string().nullable(),
    user: z.string().nullable(),
  }),
});
const File = z.record(z.string(), Entry);

export class LocalImages implements ImageResolver {
  constructor(private readonly file: string) {}

  async ensure(ref: string): Promise<RootfsImage> {
    const all = File.parse(JSON.parse(await readFile(this.file, "utf8")));
    const e = all[ref];
    if (!e) throw new ForkdError("not_found", `no image ${JSON.stringify(ref)} in ${this.file}`);
    return { ref, ...e };
  }
}
