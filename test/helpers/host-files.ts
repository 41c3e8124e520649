/**
 * What a test may have written outside its daemon's directories: a listing of chosen places
 * before and after (new entries are reported), and a search of the whole host for names that
 * contain a run's unique token (every path-like value the fuzzer sends contains it).
 */
import { execFile } from "node:child_process";
import { readdir } from "node:fs/promises";
import { join } from "node:path";

export type Listing = Map<string, Set<string>>;

/** The entries of each directory (a missing one lists as empty). */
export async function listPlaces(dirs: string[]): Promise<Listing> {
  const out: Listing = new Map();
  for (const d of dirs) out.set(d, new Set(await readdir(d).catch(() => [] as string[])));
  return out;
}

/** Entries in `after` that were not in `before`, as full paths; `ignore` filters by name. */
export function newEntries(before: Listing, after: Listing, ignore: (name: string) => boolean = () => false) {
  const out: string[] = [];
  for (const [dir, names] of after) {
    const was = before.get(dir) ?? new Set<string>();
    for (const n of names) if (!was.has(n) && !ignore(n)) out.push(join(dir, n));
  }
  return out.sort();
}

/**
 * Paths on this host (one filesystem walk per root, not crossing mounts; /proc and /sys never)
 * whose name contains `token`, except under `exclude`.
 */
export function findNamed(token: string, roots: string[], exclude: string[]): Promise<string[]> {
  const prune = ["/proc", "/sys", "/dev", ...exclude].flatMap((p, i) => [...(i ? ["-o"] : []), "-path", p]);
  const found = roots.map(
    (root) =>
      new Promise<string[]>((resolve, reject) => {
        execFile(
          "find",
          [root, "-xdev", "(", ...prune, ")", "-prune", "-o", "-name", `*${token}*`, "-print"],
          { timeout: 120_000, maxBuffer: 16 << 20 },
          // find exits 1 when some directory is unreadable (another user's, one gone meanwhile);
          // killed (its time out), it searched only part of the host.
          (err, stdout) =>
            err?.killed || err?.signal
              ? reject(new Error(`find under ${root} did not finish: ${err.message}`))
              : resolve(stdout.split("\n").filter(Boolean)),
        );
      }),
  );
  return Promise.all(found).then((lists) => [...new Set(lists.flat())].sort());
}
