/**
 * Docker's path patterns: `.dockerignore` rules (a later rule wins, `!` re-includes, a matching
 * directory excludes what is under it, `**` spans directories) and the glob of COPY sources
 * (`*`, `?`, `[...]` within one path component, `**` across). Pure code with no I/O: the CLI uses
 * it to leave ignored files out of the context it sends, and the daemon again on what it got.
 */
import { posix } from "node:path";

/** A glob over slash-separated relative paths, as a regular expression matching the whole path. */
export function globRegExp(pattern: string): RegExp {
  let re = "";
  for (let i = 0; i < pattern.length; i++) {
    const ch = pattern[i] ?? "";
    if (ch === "*") {
      if (pattern[i + 1] === "*") {
        i++;
        if (pattern[i + 1] === "/") {
          i++;
          re += "(?:.*/)?"; // `**/`: any number of directories, also none
        } else re += ".*";
      } else re += "[^/]*";
    } else if (ch === "?") re += "[^/]";
    else if (ch === "[") {
      const end = pattern.indexOf("]", i + 2);
      if (end < 0) {
        re += "\\[";
        continue;
      }
      let body = pattern.slice(i + 1, end);
      const neg = body.startsWith("^") || body.startsWith("!");
      if (neg) body = body.slice(1);
      re += `[${neg ? "^" : ""}${body.replace(/[\\\]]/g, "\\$&")}]`;
      i = end;
    } else if (ch === "\\" && i + 1 < pattern.length) {
      i++;
      re += (pattern[i] ?? "").replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
    } else re += ch.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
  }
  return new RegExp(`^${re}$`);
}

export const hasGlob = (p: string): boolean => /[*?[]/.test(p);

/** A path cleaned as Go's filepath.Clean would, relative to the context root ("" is the root). */
export function cleanRelative(p: string): string {
  const n = posix.normalize(`/${p}`); // a leading "/" means the context's root, and ".." stops there
  return n === "/" ? "" : n.replace(/^\/+/, "").replace(/\/+$/, "");
}

interface Rule {
  re: RegExp;
  negate: boolean;
}

export class IgnoreRules {
  private readonly rules: Rule[];

  constructor(text: string) {
    this.rules = [];
    for (const rawLine of text.split(/\r?\n/)) {
      const line = rawLine.trim();
      if (line === "" || line.startsWith("#")) continue;
      const negate = line.startsWith("!");
      const pat = cleanRelative((negate ? line.slice(1) : line).trim());
      if (pat === "") continue;
      this.rules.push({ re: globRegExp(pat), negate });
    }
  }

  get empty(): boolean {
    return this.rules.length === 0;
  }

  /** Whether a rule re-includes (`!`): then an ignored directory may still hold included files. */
  get reincludes(): boolean {
    return this.rules.some((r) => r.negate);
  }

  /** Whether `path` (relative, cleaned) is left out: by the last rule matching it or a parent. */
  ignored(path: string): boolean {
    const parents: string[] = [];
    const parts = path.split("/");
    for (let i = 1; i <= parts.length; i++) parents.push(parts.slice(0, i).join("/"));
    let out = false;
    for (const r of this.rules) {
      if (parents.some((p) => r.re.test(p))) out = !r.negate;
    }
    return out;
  }
}
