/**
 * A build context on the host: the files a COPY or ADD may name. Scanned once (lstat only: a
 * symbolic link, a device or a socket is refused, so nothing is ever read from outside the
 * folder), `.dockerignore` applied, bounded. COPY sources resolve against it as Docker does:
 * cleaned paths that may not climb out (`..`), globs (`*`, `?`, `[...]`, `**`), a directory's
 * contents copied recursively, several sources only into a directory (`dest/`). Each step's
 * files are hashed (path, mode, content) for its cache key.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, open, readdir, readFile } from "node:fs/promises";
import { join, posix } from "node:path";
import { ForkdError } from "../../util/index.js";
import { Glob, IgnoreRules, cleanRelative, hasGlob } from "./ignore.js";
import { syntaxError } from "./lines.js";

export const CONTEXT_LIMITS = { entries: 100_000, depth: 64 };

export interface ContextEntry {
  /** Relative to the context's root, cleaned ("" is the root). */
  path: string;
  type: "file" | "dir";
  /** Permission bits (mode & 0o7777). */
  mode: number;
  size: number;
}

/** One file or directory a COPY writes in the guest. */
export interface CopyItem {
  /** The file on the host (null: a directory). */
  src: string | null;
  dest: string;
  type: "file" | "dir";
  mode: number;
  size: number;
}

const ARCHIVE_MAGIC: Array<[number, Buffer]> = [
  [0, Buffer.from([0x1f, 0x8b])], // gzip
  [0, Buffer.from("BZh")], // bzip2
  [0, Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00])], // xz
  [0, Buffer.from([0x28, 0xb5, 0x2f, 0xfd])], // zstd
  [257, Buffer.from("ustar")], // tar
];

export class BuildContext {
  private constructor(
    readonly dir: string,
    readonly entries: Map<string, ContextEntry>,
  ) {}

  /** Walks `dir` (lstat, never following a link), leaving out what `.dockerignore` excludes. */
  static async scan(dir: string): Promise<BuildContext> {
    const ignoreText = await readFile(join(dir, ".dockerignore"), "utf8").catch(() => "");
    const rules = new IgnoreRules(ignoreText);
    const entries = new Map<string, ContextEntry>();
    const root = await lstat(dir);
    if (!root.isDirectory()) throw new ForkdError("invalid_argument", "the build context is not a directory");
    entries.set("", { path: "", type: "dir", mode: root.mode & 0o7777, size: 0 });
    const walk = async (rel: string, depth: number): Promise<void> => {
      if (depth > CONTEXT_LIMITS.depth) {
        throw new ForkdError(
          "invalid_argument",
          `the build context is nested deeper than ${CONTEXT_LIMITS.depth}`,
        );
      }
      const names = (await readdir(join(dir, rel))).sort();
      for (const name of names) {
        const p = rel === "" ? name : `${rel}/${name}`;
        const ignored = rules.ignored(p);
        const st = await lstat(join(dir, p));
        if (st.isDirectory()) {
          if (ignored && !rules.reincludes) continue;
          if (!ignored) entries.set(p, { path: p, type: "dir", mode: st.mode & 0o7777, size: 0 });
          await walk(p, depth + 1);
        } else if (ignored) {
          continue;
        } else if (st.isFile()) {
          entries.set(p, { path: p, type: "file", mode: st.mode & 0o7777, size: st.size });
        } else {
          const what = st.isSymbolicLink() ? "a symbolic link" : "not a regular file or directory";
          throw new ForkdError(
            "invalid_argument",
            `build context: ${p} is ${what} (not supported; leave it out with .dockerignore)`,
            { path: p },
          );
        }
        if (entries.size > CONTEXT_LIMITS.entries) {
          throw new ForkdError(
            "invalid_argument",
            `the build context has more than ${CONTEXT_LIMITS.entries} entries`,
          );
        }
      }
    };
    await walk("", 0);
    // A re-included file under an ignored directory needs its parents.
    for (const p of [...entries.keys()]) {
      const parts = p.split("/");
      for (let i = 1; i < parts.length; i++) {
        const d = parts.slice(0, i).join("/");
        if (!entries.has(d)) entries.set(d, { path: d, type: "dir", mode: 0o755, size: 0 });
      }
    }
    return new BuildContext(dir, entries);
  }

  /** The files and directories a COPY/ADD of `sources` to `dest` writes, in order (parents first). */
  resolve(line: number, op: string, sources: string[], dest: string): CopyItem[] {
    const matches: ContextEntry[] = [];
    for (const s of sources) {
      const rel = posix.normalize(s.replace(/^\/+/, "") || ".");
      if (rel === ".." || rel.startsWith("../")) {
        throw syntaxError(line, `${op} ${s}: outside the build context`);
      }
      const p = cleanRelative(s);
      if (hasGlob(p)) {
        let re: Glob;
        try {
          re = new Glob(p);
        } catch (e) {
          if (e instanceof ForkdError) throw syntaxError(line, `${op} ${s}: ${e.message}`);
          throw e;
        }
        const found = [...this.entries.values()].filter((e) => e.path !== "" && re.test(e.path));
        if (found.length === 0) throw syntaxError(line, `${op} ${s}: no file in the build context matches`);
        matches.push(...found);
      } else {
        const e = this.entries.get(p);
        if (!e)
          throw syntaxError(line, `${op} ${s}: not in the build context (or left out by .dockerignore)`);
        matches.push(e);
      }
    }
    const intoDir = dest.endsWith("/");
    if (matches.length > 1 && !intoDir) {
      throw syntaxError(line, `${op} with several sources: the destination must be a directory ending in /`);
    }
    const out = new Map<string, CopyItem>();
    const add = (e: ContextEntry, to: string) =>
      out.set(to, {
        src: e.type === "file" ? join(this.dir, e.path) : null,
        dest: to,
        type: e.type,
        mode: e.mode,
        size: e.size,
      });
    for (const m of matches) {
      if (m.type === "dir") {
        const base = dest.replace(/\/+$/, "") || "/";
        const prefix = m.path === "" ? "" : `${m.path}/`;
        out.set(base, { src: null, dest: base, type: "dir", mode: m.mode, size: 0 });
        const under = [...this.entries.values()]
          .filter((e) => e.path !== "" && e.path.startsWith(prefix) && e.path !== m.path)
          .sort((a, b) => (a.path < b.path ? -1 : 1));
        for (const e of under) add(e, posix.join(base, e.path.slice(prefix.length)));
      } else {
        add(m, intoDir ? posix.join(dest, posix.basename(m.path)) : dest);
      }
    }
    return [...out.values()];
  }

  /** Refuses a local archive for ADD: Docker would unpack it, forkd never does. */
  async refuseArchives(line: number, items: CopyItem[]): Promise<void> {
    for (const it of items) {
      if (!it.src) continue;
      const fh = await open(it.src, "r");
      try {
        const head = Buffer.alloc(512);
        const { bytesRead } = await fh.read(head, 0, 512, 0);
        for (const [at, magic] of ARCHIVE_MAGIC) {
          if (bytesRead >= at + magic.length && head.subarray(at, at + magic.length).equals(magic)) {
            throw syntaxError(
              line,
              `ADD of an archive (${it.dest}): Docker would unpack it, forkd does not; COPY it and RUN tar`,
            );
          }
        }
      } finally {
        await fh.close();
      }
    }
  }
}

const sha256Of = (path: string): Promise<string> =>
  new Promise((resolve, reject) => {
    const h = createHash("sha256");
    createReadStream(path)
      .on("data", (d) => h.update(d))
      .on("error", reject)
      .on("end", () => resolve(h.digest("hex")));
  });

/** The hash of what a COPY writes: each item's destination, type, mode and content. */
export async function hashItems(items: CopyItem[]): Promise<string> {
  const h = createHash("sha256").update("forkd-dockerfile-copy/1\n");
  for (const it of [...items].sort((a, b) => (a.dest < b.dest ? -1 : a.dest > b.dest ? 1 : 0))) {
    const sum = it.src ? await sha256Of(it.src) : "-";
    h.update(`${JSON.stringify(it.dest)} ${it.type} ${it.mode.toString(8)} ${sum}\n`);
  }
  return h.digest("hex");
}
