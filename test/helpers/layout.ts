/**
 * The map of the source tree (docs/layout.md): every file under src/ with the first sentence of
 * its header comment, grouped by folder. Made from the files themselves, so it cannot drift
 * from them: test/unit/layout.test.ts compares it with the committed document.
 */
import { readdir, readFile } from "node:fs/promises";
import { join, relative } from "node:path";

/** Files under `dir` (recursively), as paths relative to `root`, sorted. */
async function walk(root: string, dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...(await walk(root, p)));
    else if (e.name.endsWith(".ts")) out.push(relative(root, p));
  }
  return out;
}

/** A folder's files before its sub-folders' (the folder, then the name). */
const byFolder = (a: string, b: string): number => {
  const da = a.slice(0, a.lastIndexOf("/"));
  const db = b.slice(0, b.lastIndexOf("/"));
  return da === db ? (a < b ? -1 : 1) : da < db ? -1 : 1;
};

/** The first sentence of a file's leading doc comment (after a #! line), or null if it has none. */
export function headerOf(source: string): string | null {
  const m = /^(?:#![^\n]*\n)?\/\*\*([\s\S]*?)\*\//.exec(source);
  if (!m?.[1]) return null;
  const text = m[1]
    .split("\n")
    .map((l) => l.replace(/^\s*\*\s?/, "").trim())
    .filter((l) => l !== "")
    .join(" ");
  if (text === "") return null;
  // Up to the first full stop that ends a sentence (not one inside a name like `x.ts` or "e.g.").
  const end = /\.(?=\s+[A-Z(`"])/.exec(text);
  return end ? text.slice(0, end.index + 1) : text;
}

export interface LayoutEntry {
  file: string;
  header: string | null;
}

export async function layoutEntries(repo: string): Promise<LayoutEntry[]> {
  const files = (await walk(repo, join(repo, "src"))).sort(byFolder);
  return Promise.all(
    files.map(async (file) => ({ file, header: headerOf(await readFile(join(repo, file), "utf8")) })),
  );
}

export function renderLayout(entries: LayoutEntry[]): string {
  const lines = [
    "# The source tree",
    "",
    "Every file under `src/`, by folder, with the first sentence of its header comment (what it",
    "holds). Generated from the files: `npm run layout` rewrites it, and a unit test fails when it",
    "is out of date. How the parts fit together is in [architecture.md](architecture.md).",
  ];
  let folder = "";
  for (const e of entries) {
    const dir = e.file.slice(0, e.file.lastIndexOf("/"));
    if (dir !== folder) {
      folder = dir;
      lines.push("", `## ${dir}/`, "");
    }
    lines.push(`- \`${e.file.slice(dir.length + 1)}\`: ${e.header ?? "(no header)"}`);
  }
  return lines.join("\n") + "\n";
}
