/**
 * Docker's path patterns: `.dockerignore` rules (a later rule wins, `!` re-includes, a matching
 * directory excludes what is under it, `**` spans directories) and the glob of COPY sources
 * (`*`, `?`, `[...]` within one path component, `**` across). Pure code with no I/O: the CLI uses
 * it to leave ignored files out of the context it sends, and the daemon again on what it got.
 * Matching takes polynomial steps (no backtracking regular expression: a hostile pattern must not
 * block the daemon's event loop), and patterns are bounded (GLOB_LIMITS); a malformed class such
 * as `[z-a]` is an invalid_argument.
 */
import { posix } from "node:path";
import { ForkdError } from "../../util/index.js";

/** Bounds on a pattern (a .dockerignore line or a COPY source): untrusted input. */
export const GLOB_LIMITS = { chars: 4096, wildcards: 256 };

type Token =
  | { t: "char"; c: string }
  | { t: "one" } // `?`: one character but "/"
  | { t: "class"; neg: boolean; ranges: [number, number][] } // `[...]`: one character but "/"
  | { t: "star" } // `*`: any run without "/"
  | { t: "any" } // `**` not before "/": any run
  | { t: "dirs" }; // `**/`: any number of whole directories, also none

const badPattern = (pattern: string, why: string): ForkdError =>
  new ForkdError("invalid_argument", `the pattern ${JSON.stringify(pattern.slice(0, 200))}: ${why}`, {
    pattern: pattern.slice(0, 200),
  });

/** The ranges of a `[...]` body (no brackets, no leading negation): `a-z` ranges, else chars. */
function classRanges(pattern: string, body: string): [number, number][] {
  const chars = [...body];
  const out: [number, number][] = [];
  for (let i = 0; i < chars.length; i++) {
    const lo = chars[i] ?? "";
    const hi = chars[i + 2];
    if (chars[i + 1] === "-" && hi !== undefined) {
      const a = lo.codePointAt(0) ?? 0;
      const b = hi.codePointAt(0) ?? 0;
      if (a > b) throw badPattern(pattern, `the range ${lo}-${hi} is out of order`);
      out.push([a, b]);
      i += 2;
    } else out.push([lo.codePointAt(0) ?? 0, lo.codePointAt(0) ?? 0]);
  }
  return out;
}

function tokenize(pattern: string): Token[] {
  if (pattern.length > GLOB_LIMITS.chars)
    throw badPattern(pattern, `longer than ${GLOB_LIMITS.chars} characters`);
  const out: Token[] = [];
  let wildcards = 0;
  for (let i = 0; i < pattern.length; i++) {
    const ch = pattern[i] ?? "";
    if (ch === "*") {
      wildcards++;
      if (pattern[i + 1] === "*") {
        i++;
        if (pattern[i + 1] === "/") {
          i++;
          out.push({ t: "dirs" });
        } else out.push({ t: "any" });
      } else out.push({ t: "star" });
    } else if (ch === "?") {
      wildcards++;
      out.push({ t: "one" });
    } else if (ch === "[") {
      const end = pattern.indexOf("]", i + 2);
      if (end < 0) {
        out.push({ t: "char", c: "[" });
        continue;
      }
      wildcards++;
      let body = pattern.slice(i + 1, end);
      const neg = body.startsWith("^") || body.startsWith("!");
      if (neg) body = body.slice(1);
      if (body === "") throw badPattern(pattern, "an empty [] class");
      out.push({ t: "class", neg, ranges: classRanges(pattern, body) });
      i = end;
    } else if (ch === "\\" && i + 1 < pattern.length) {
      i++;
      out.push({ t: "char", c: pattern[i] ?? "" });
    } else out.push({ t: "char", c: ch });
  }
  if (wildcards > GLOB_LIMITS.wildcards)
    throw badPattern(pattern, `more than ${GLOB_LIMITS.wildcards} wildcards`);
  return out;
}

function single(tok: Token, ch: string): boolean {
  if (tok.t === "char") return tok.c === ch;
  if (ch === "/") return false;
  if (tok.t === "one") return true;
  if (tok.t !== "class") return false;
  const c = ch.codePointAt(0) ?? 0;
  return tok.ranges.some(([a, b]) => c >= a && c <= b) !== tok.neg;
}

/**
 * A compiled glob over slash-separated relative paths, matching the whole path. Matching is a
 * dynamic programme over (pattern token, path position): O(tokens x path length) steps whatever
 * the pattern, where a backtracking regular expression is exponential (`*a*a*a*a*ab`).
 */
export class Glob {
  private readonly tokens: Token[];

  constructor(pattern: string) {
    this.tokens = tokenize(pattern);
  }

  test(path: string): boolean {
    const p = [...path]; // by code point, as a regular expression with the u flag would
    const n = p.length;
    const toks = this.tokens;
    // next[i]: tokens from k+1 on match p[i..]; cur[i]: tokens from k on match p[i..].
    let next = new Uint8Array(n + 1);
    next[n] = 1;
    for (let k = toks.length - 1; k >= 0; k--) {
      const tok = toks[k] as Token;
      const cur = new Uint8Array(n + 1);
      // For `**/`: whether some "/" at j >= i has next[j + 1] (the directories then the rest).
      let slashThen = 0;
      for (let i = n; i >= 0; i--) {
        const ch = p[i];
        if (tok.t === "star") cur[i] = next[i] || (ch !== undefined && ch !== "/" && cur[i + 1]) ? 1 : 0;
        else if (tok.t === "any") cur[i] = next[i] || (ch !== undefined && cur[i + 1]) ? 1 : 0;
        else if (tok.t === "dirs") {
          if (ch === "/" && next[i + 1]) slashThen = 1;
          cur[i] = next[i] || slashThen ? 1 : 0;
        } else cur[i] = ch !== undefined && single(tok, ch) && next[i + 1] ? 1 : 0;
      }
      next = cur;
    }
    return next[0] === 1;
  }
}

export const hasGlob = (p: string): boolean => /[*?[]/.test(p);

/** A path cleaned as Go's filepath.Clean would, relative to the context root ("" is the root). */
export function cleanRelative(p: string): string {
  const n = posix.normalize(`/${p}`); // a leading "/" means the context's root, and ".." stops there
  return n === "/" ? "" : n.replace(/^\/+/, "").replace(/\/+$/, "");
}

interface Rule {
  re: Glob;
  negate: boolean;
}

export class IgnoreRules {
  private readonly rules: Rule[];

  constructor(text: string) {
    this.rules = [];
    const lines = text.split(/\r?\n/);
    for (const [i, rawLine] of lines.entries()) {
      const line = rawLine.trim();
      if (line === "" || line.startsWith("#")) continue;
      const negate = line.startsWith("!");
      const pat = cleanRelative((negate ? line.slice(1) : line).trim());
      if (pat === "") continue;
      let re: Glob;
      try {
        re = new Glob(pat);
      } catch (e) {
        if (e instanceof ForkdError) {
          throw new ForkdError("invalid_argument", `.dockerignore line ${i + 1}: ${e.message}`, {
            ...e.details,
            line: i + 1,
          });
        }
        throw e;
      }
      this.rules.push({ re, negate });
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
