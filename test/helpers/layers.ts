/**
 * The layering of src/ and its check: the rules are read from docs/architecture.md (a fenced
 * `layers` block), the imports from the files themselves (TypeScript's own pre-parser: static,
 * `export … from`, type-only and dynamic imports alike), and `violations` says every import that
 * breaks a rule. test/unit/layering.test.ts runs it on the tree and on planted trees.
 */
import { readdir, readFile } from "node:fs/promises";
import { dirname, join, normalize, relative } from "node:path";
import ts from "typescript";

/** One layer of the table: its folders (top-level folders of src/), and whether they may import each other. */
export interface Layer {
  name: string;
  folders: string[];
  /** Folders of this layer may import one another (without cycles); false for the front doors. */
  sideways: boolean;
}

/** The rules: the layers top to bottom, and the packages only some folders may use. */
export interface Rules {
  layers: Layer[];
  /** A package and the folders that alone may import it (the HTTP stack: front doors only). */
  packages: Map<string, Set<string>>;
}

/** A source file (path relative to src/, e.g. `sandbox/fork.ts`) and what it imports. */
export interface SourceFile {
  file: string;
  /** Relative imports, resolved to paths relative to src/ (`.ts`), and package names. */
  files: string[];
  packages: string[];
  /** For an index.ts: every statement is `export { named } from "./…"` (no `export *`, no code). */
  namedReexportsOnly: boolean;
}

/**
 * The rules from docs/architecture.md's block:
 *
 *     ```layers
 *     front doors   | api e2b console | apart
 *     application   | app
 *     ...
 *     packages      | hono: api e2b console http
 *     ```
 * One line a layer, top first: a name, its folders, and `apart` when they may not import each
 * other. `packages` lines name a package and the folders that may import it.
 */
export function parseRules(doc: string): Rules {
  const block = /```layers\n([\s\S]*?)```/.exec(doc)?.[1];
  if (block === undefined) throw new Error("docs/architecture.md has no ```layers block");
  const layers: Layer[] = [];
  const packages = new Map<string, Set<string>>();
  for (const line of block.split("\n")) {
    if (line.trim() === "") continue;
    const cells = line.split("|").map((c) => c.trim());
    const [name = "", second = "", third = ""] = cells;
    if (name === "packages") {
      const [pkg = "", users = ""] = second.split(":").map((c) => c.trim());
      packages.set(pkg, new Set(users.split(/\s+/).filter(Boolean)));
      continue;
    }
    layers.push({ name, folders: second.split(/\s+/).filter(Boolean), sideways: third !== "apart" });
  }
  return { layers, packages };
}

/** The package an import names (`@scope/name` or `name`), or null for a relative or built-in one. */
function packageOf(spec: string): string | null {
  if (spec.startsWith(".") || spec.startsWith("node:")) return null;
  const parts = spec.split("/");
  return spec.startsWith("@") ? parts.slice(0, 2).join("/") : (parts[0] ?? spec);
}

/** What one file imports, from its text. */
export function importsOf(file: string, text: string): SourceFile {
  const pre = ts.preProcessFile(text, true, true);
  const files: string[] = [];
  const packages: string[] = [];
  for (const { fileName: spec } of pre.importedFiles) {
    const pkg = packageOf(spec);
    if (pkg !== null) packages.push(pkg);
    else if (spec.startsWith(".")) files.push(normalize(join(dirname(file), spec)).replace(/\.js$/, ".ts"));
  }
  const namedReexportsOnly =
    !file.endsWith("index.ts") ||
    ts
      .createSourceFile(file, text, ts.ScriptTarget.Latest)
      .statements.every(
        (st) =>
          ts.isExportDeclaration(st) &&
          st.moduleSpecifier !== undefined &&
          st.exportClause !== undefined &&
          ts.isNamedExports(st.exportClause),
      );
  return { file, files, packages, namedReexportsOnly };
}

/** Every .ts file under src/ with its imports. */
export async function readTree(srcDir: string): Promise<SourceFile[]> {
  const out: SourceFile[] = [];
  const walk = async (dir: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.name.endsWith(".ts")) out.push(importsOf(relative(srcDir, p), await readFile(p, "utf8")));
    }
  };
  await walk(srcDir);
  return out.sort((a, b) => (a.file < b.file ? -1 : 1));
}

/** A file's top-level folder under src/ (`sandbox` for `sandbox/fork.ts`; `` for a file at the root). */
export const folderOf = (file: string): string =>
  file.includes("/") ? file.slice(0, file.indexOf("/")) : "";

/** Cycles in a graph, each as its nodes in order (one per strongly connected component of size > 1 or a self loop). */
export function cycles(edges: Map<string, Set<string>>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  const counter = { n: 0 };
  const visit = (v: string): void => {
    index.set(v, counter.n);
    low.set(v, counter.n);
    counter.n += 1;
    stack.push(v);
    onStack.add(v);
    for (const w of edges.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v) ?? 0, low.get(w) ?? 0));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v) ?? 0, index.get(w) ?? 0));
    }
    if (low.get(v) !== index.get(v)) return;
    const scc: string[] = [];
    for (;;) {
      const w = stack.pop() as string;
      onStack.delete(w);
      scc.push(w);
      if (w === v) break;
    }
    if (scc.length > 1 || edges.get(v)?.has(v)) out.push(scc.sort());
  };
  for (const v of [...edges.keys()].sort()) if (!index.has(v)) visit(v);
  return out;
}

/**
 * Every import of `tree` that breaks `rules`, one line each:
 *   - every top-level folder (and no file at src/'s root) is in exactly one layer;
 *   - a folder imports from its own layer (unless the layer is `apart`) or a lower one, never higher;
 *   - another folder is imported through its `index.ts` only (what the folder offers), and an
 *     index re-exports named things from its own folder, nothing else;
 *   - no cycle between folders, none between files;
 *   - a package reserved to some folders is imported by those alone.
 */
export function violations(tree: SourceFile[], rules: Rules): string[] {
  const out: string[] = [];
  const rank = new Map<string, { rank: number; layer: Layer }>();
  rules.layers.forEach((layer, i) => {
    for (const f of layer.folders) {
      if (rank.has(f)) out.push(`folder ${f} is in two layers`);
      rank.set(f, { rank: i, layer });
    }
  });
  const folderEdges = new Map<string, Set<string>>();
  const fileEdges = new Map<string, Set<string>>();
  const known = new Set(tree.map((s) => s.file));
  for (const s of tree) {
    const from = folderOf(s.file);
    const mine = rank.get(from);
    if (mine === undefined) {
      out.push(`${s.file}: folder ${from === "" ? "(src/ itself)" : from} is in no layer`);
      continue;
    }
    fileEdges.set(s.file, new Set(s.files.filter((f) => known.has(f))));
    for (const target of s.files) {
      if (target.startsWith("..")) {
        out.push(`${s.file} imports ${target}, outside src/`);
        continue;
      }
      const to = folderOf(target);
      if (to === from) continue;
      if (!folderEdges.has(from)) folderEdges.set(from, new Set());
      folderEdges.get(from)?.add(to);
      const theirs = rank.get(to);
      if (theirs === undefined) continue; // reported with the target's own files
      if (theirs.rank < mine.rank)
        out.push(`${s.file} imports ${target}: ${theirs.layer.name} is above ${mine.layer.name}`);
      else if (theirs.rank === mine.rank && !mine.layer.sideways)
        out.push(`${s.file} imports ${target}: ${mine.layer.name} do not import one another`);
      if (target !== `${to}/index.ts`)
        out.push(`${s.file} imports ${target}: another folder is reached through ${to}/index.ts`);
    }
    if (s.file === `${from}/index.ts` && !s.namedReexportsOnly)
      out.push(`${s.file}: an index holds only \`export { named } from "./file.js"\` lines`);
    if (s.file === `${from}/index.ts`)
      for (const target of s.files)
        if (folderOf(target) !== from)
          out.push(`${s.file} re-exports ${target}: an index offers its own folder's files`);
    for (const pkg of s.packages) {
      const users = rules.packages.get(pkg);
      if (users !== undefined && !users.has(from))
        out.push(`${s.file} imports ${pkg}: only ${[...users].join(", ")} may`);
    }
  }
  for (const c of cycles(folderEdges)) out.push(`folders import one another in a cycle: ${c.join(" → ")}`);
  for (const c of cycles(fileEdges)) out.push(`files import one another in a cycle: ${c.join(" → ")}`);
  return out;
}
