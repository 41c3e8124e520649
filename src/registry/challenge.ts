/**
 * `WWW-Authenticate` challenges (RFC 7235): `Bearer realm="…",service="…",scope="…"` or
 * `Basic realm="…"`, possibly several in one header. Quoted values may hold commas and escaped
 * quotes; parameter names are case-insensitive.
 */

export interface Challenge {
  /** Lowercased: "bearer", "basic", … */
  scheme: string;
  params: Record<string, string>;
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+/;
const MAX_HEADER = 8192;

export function parseChallenges(header: string | null): Challenge[] {
  if (!header || header.length > MAX_HEADER) return [];
  const out: Challenge[] = [];
  let s = header;
  const skipSpace = () => {
    s = s.replace(/^[ \t]+/, "");
  };
  const skipCommas = () => {
    s = s.replace(/^[ \t,]+/, "");
  };
  skipCommas();
  while (s.length > 0) {
    const scheme = TOKEN.exec(s)?.[0];
    if (!scheme) break;
    s = s.slice(scheme.length);
    const c: Challenge = { scheme: scheme.toLowerCase(), params: {} };
    out.push(c);
    skipSpace();
    // Parameters: name=value or name="quoted", separated by commas, until the next scheme.
    for (;;) {
      skipCommas();
      const m = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+)[ \t]*=[ \t]*/.exec(s);
      if (!m) break;
      s = s.slice(m[0].length);
      const name = (m[1] ?? "").toLowerCase();
      let value = "";
      if (s.startsWith('"')) {
        let i = 1;
        for (; i < s.length && s[i] !== '"'; i++) {
          if (s[i] === "\\" && i + 1 < s.length) i++;
          value += s[i];
        }
        s = s.slice(i + 1);
      } else {
        value = TOKEN.exec(s)?.[0] ?? "";
        s = s.slice(value.length);
      }
      if (!(name in c.params)) c.params[name] = value;
      skipSpace();
      if (!s.startsWith(",")) break;
    }
    skipCommas();
  }
  return out;
}
