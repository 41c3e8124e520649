/**
 * A build context received as a tar stream (the API's body), unpacked into a fresh directory:
 * plain files and directories only (links, devices and the like are refused by the reader),
 * every path relative and inside (no `..`, no absolute name), bounded in bytes, entries and
 * depth, modes kept (no set-id bits). Written with O_EXCL into a directory nobody else writes,
 * so an entry can never reach outside it.
 */
import { mkdir, open } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { ForkdError } from "../../util/index.js";
import { TarReader } from "../../archive/index.js";
import { CONTEXT_TAR } from "../../archive/index.js";
import { staysInside } from "../../archive/index.js";
import { CONTEXT_LIMITS } from "./context.js";

/** Bytes of file data a context may hold (the request body's bound applies too). */
export const MAX_CONTEXT_BYTES = 2 * 2 ** 30;

const bad = (msg: string, name?: string) =>
  new ForkdError("invalid_argument", `build context: ${msg}`, name === undefined ? {} : { entry: name });

export async function unpackContext(
  input: AsyncIterable<Uint8Array>,
  dir: string,
  maxBytes = MAX_CONTEXT_BYTES,
): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o755 });
  let total = 0;
  let entries = 0;
  let fh: FileHandle | null = null;
  const made = new Set<string>([""]);
  const ensureParents = async (path: string) => {
    const parts = path.split("/");
    for (let i = 1; i < parts.length; i++) {
      const d = parts.slice(0, i).join("/");
      if (made.has(d)) continue;
      await mkdir(join(dir, d), { mode: 0o755 }).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== "EEXIST") throw e;
      });
      made.add(d);
    }
  };
  const reader = new TarReader(
    {
      entry: async (e) => {
        if (++entries > CONTEXT_LIMITS.entries) throw bad(`more than ${CONTEXT_LIMITS.entries} entries`);
        const parts = e.path.split("/");
        if (!staysInside(e.path)) {
          throw bad(`${JSON.stringify(e.name)} is not a path inside the context`, e.name);
        }
        if (parts.length > CONTEXT_LIMITS.depth)
          throw bad(`${JSON.stringify(e.name)} is nested too deep`, e.name);
        if (e.path === "") return;
        const mode = e.mode & 0o777;
        await ensureParents(e.path);
        if (e.type === "dir") {
          if (made.has(e.path)) return;
          await mkdir(join(dir, e.path), { mode: mode | 0o700 }).catch((err: NodeJS.ErrnoException) => {
            if (err.code !== "EEXIST") throw err;
          });
          made.add(e.path);
          return;
        }
        total += e.size;
        if (total > maxBytes) throw bad(`larger than ${maxBytes} bytes`);
        // "wx": a name given twice, or one that is a directory here, is refused.
        fh = await open(join(dir, e.path), "wx", mode | 0o600).catch((err: NodeJS.ErrnoException) => {
          throw bad(
            `${JSON.stringify(e.name)} cannot be written (${err.code ?? "error"}: given twice?)`,
            e.name,
          );
        });
        await fh.chmod(mode);
      },
      data: async (chunk, offset) => {
        if (!fh) throw bad("data outside a file");
        await fh.write(chunk, 0, chunk.length, offset);
      },
      end: async () => {
        const f = fh;
        fh = null;
        await f?.close();
      },
    },
    CONTEXT_TAR,
  );
  try {
    for await (const chunk of input) await reader.push(Buffer.from(chunk));
    reader.finish();
  } finally {
    await (fh as FileHandle | null)?.close().catch(() => undefined);
  }
}
