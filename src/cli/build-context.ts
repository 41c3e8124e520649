/**
 * `forkd snapshot --dockerfile PATH`: its folder as a build context, sent as a tar stream. The
 * folder is walked without following links; what `.dockerignore` excludes is left out (the
 * Dockerfile and .dockerignore themselves are always sent, as Docker does); a symbolic link or
 * a special file is refused naming it. GNU tar writes the archive from the list (no recursion),
 * so only the listed files are read.
 */
import { spawn } from "node:child_process";
import { lstat, readdir, readFile } from "node:fs/promises";
import { join, relative } from "node:path";
import type { Readable } from "node:stream";
import { IgnoreRules } from "../image/index.js";

const MAX_ENTRIES = 100_000;

/** The context's paths to send, relative to `dir`, parents before children. */
export async function contextPaths(dir: string, dockerfile: string): Promise<string[]> {
  const rules = new IgnoreRules(await readFile(join(dir, ".dockerignore"), "utf8").catch(() => ""));
  const keep = new Set([relative(dir, dockerfile), ".dockerignore"]);
  const out: string[] = [];
  const walk = async (rel: string): Promise<void> => {
    for (const name of (await readdir(join(dir, rel))).sort()) {
      const p = rel === "" ? name : `${rel}/${name}`;
      const ignored = rules.ignored(p) && !keep.has(p);
      const st = await lstat(join(dir, p));
      if (st.isDirectory()) {
        if (ignored && !rules.reincludes) continue;
        if (!ignored) out.push(p);
        await walk(p);
      } else if (!ignored) {
        if (!st.isFile()) {
          throw new Error(
            `${join(dir, p)}: ${st.isSymbolicLink() ? "a symbolic link" : "a special file"} in the build context is not supported (leave it out with .dockerignore)`,
          );
        }
        out.push(p);
      }
      if (out.length > MAX_ENTRIES) throw new Error(`the build context has more than ${MAX_ENTRIES} entries`);
    }
  };
  await walk("");
  return out;
}

/** The tar stream of `paths` in `dir`; `done` settles when tar has exited (rejects on failure). */
export function contextTar(dir: string, paths: string[]): { stream: Readable; done: Promise<void> } {
  const child = spawn("tar", ["-c", "-f", "-", "--no-recursion", "--null", "-T", "-"], {
    cwd: dir,
    stdio: ["pipe", "pipe", "pipe"],
    // tar needs nothing of the caller's environment (names are bytes: the C locale).
    env: { PATH: "/usr/local/bin:/usr/bin:/bin", LC_ALL: "C" },
  });
  let err = "";
  child.stderr.on("data", (d: Buffer) => (err = (err + d.toString()).slice(-2000)));
  child.stdin.on("error", () => undefined);
  child.stdin.end(paths.map((p) => `${p}\0`).join(""));
  const done = new Promise<void>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) =>
      code === 0
        ? resolve()
        : reject(new Error(`tar of the build context failed (exit ${code}): ${err.trim()}`)),
    );
  });
  done.catch(() => undefined);
  return { stream: child.stdout, done };
}
