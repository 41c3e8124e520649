/**
 * Values for the API fuzzer (test/integration/fuzz.test.ts), from the JSON Schemas of
 * docs/openapi.json: valid values (so requests get past parsing and reach deep code), hostile
 * values (wrong types, huge and unicode strings, extreme numbers, path traversal), and
 * mutations of a valid value at a random place in it (replace, drop, add a field).
 *
 * Every path-like hostile value contains `token` (unique to the run), so a file it made on the
 * host can be found by name.
 */
import type { Rng } from "./rng.js";

export type Schema = Record<string, unknown>;

export interface ValueContext {
  r: Rng;
  /** Follows a $ref. */
  resolve(s: Schema): Schema;
  /** A value for a field named `name` (or a string matching `pattern`), or undefined: the schema decides. */
  hint(name: string, s: Schema): unknown;
}

const B32 = "abcdefghijklmnopqrstuvwxyz234567";
export const b32 = (r: Rng, n: number): string => Array.from({ length: n }, () => r.pick([...B32])).join("");

/** Strings that match patterns the contract uses, for patterns no hint covers. */
function forPattern(r: Rng, pattern: string): string | undefined {
  const re = new RegExp(pattern);
  const tries = [
    "fz" + b32(r, 6),
    "sb-" + b32(r, 16),
    "tok-" + b32(r, 12),
    "FZ_" + b32(r, 3).toUpperCase(),
    `${r.int(1, 30000)}-${r.int(30001, 65535)}`,
    "a",
  ];
  return tries.find((t) => re.test(t));
}

const bounded = (v: unknown, dflt: number): number => (typeof v === "number" ? v : dflt);

/** A value valid against `schema` (best effort: patterns come from hints). */
export function validValue(ctx: ValueContext, schema: Schema, name = "", depth = 0): unknown {
  const s = ctx.resolve(schema);
  const { r } = ctx;
  const hinted = ctx.hint(name, s);
  if (hinted !== undefined) return hinted;
  if (Array.isArray(s.anyOf)) return validValue(ctx, r.pick(s.anyOf as Schema[]), name, depth);
  if (Array.isArray(s.enum)) return r.pick(s.enum as unknown[]);
  switch (s.type) {
    case "string": {
      if (typeof s.pattern === "string") return forPattern(r, s.pattern) ?? "a";
      const min = bounded(s.minLength, 0);
      const max = Math.min(bounded(s.maxLength, 24), min + 24);
      return Array.from({ length: r.int(Math.max(min, 1), Math.max(max, 1)) }, () =>
        r.pick([..."abcxyz019 _-/"]),
      ).join("");
    }
    case "integer":
    case "number": {
      const min = bounded(s.minimum, 0);
      const max = bounded(s.maximum, min + 1000);
      const v = r.chance(0.2) ? (r.chance(0.5) ? min : max) : r.int(min, Math.min(max, min + 1000));
      return s.type === "number" && r.chance(0.3) ? Math.min(max, v + 0.5) : v;
    }
    case "boolean":
      return r.chance(0.5);
    case "null":
      return null;
    case "array": {
      const items = (s.items ?? {}) as Schema;
      const min = bounded(s.minItems, 0);
      const n = r.int(min, Math.min(bounded(s.maxItems, min + 2), min + 2));
      return Array.from({ length: n }, () => validValue(ctx, items, name, depth + 1));
    }
    case "object":
    default: {
      const out: Record<string, unknown> = {};
      const props = (s.properties ?? {}) as Record<string, Schema>;
      const required = new Set((s.required ?? []) as string[]);
      for (const [k, ps] of Object.entries(props)) {
        if (required.has(k) || (depth < 3 && r.chance(0.5))) out[k] = validValue(ctx, ps, k, depth + 1);
      }
      const extra = s.additionalProperties;
      if (extra && typeof extra === "object" && depth < 3) {
        const names = (s.propertyNames ?? {}) as Schema;
        for (let i = r.int(0, 2); i > 0; i--) {
          const key = String(ctx.hint(`key:${name}`, names) ?? validValue(ctx, names, "", depth + 1));
          out[key || "k"] = validValue(ctx, extra as Schema, "", depth + 1);
        }
      }
      return out;
    }
  }
}

/** Deeply nested arrays. */
const nested = (n: number): unknown => {
  let v: unknown = [];
  for (let i = 0; i < n; i++) v = [v];
  return v;
};

/** Path-like strings aimed at the host's filesystem (host and guest paths, ids, tags, refs). */
export function traversals(token: string): string[] {
  return [
    `../../escape-${token}`,
    `../../../../../../tmp/escape-${token}`,
    `/../../../../tmp/escape-${token}`,
    `/tmp/escape-${token}`,
    `..%2F..%2Fescape-${token}`,
    `....//....//escape-${token}`,
    `..\\..\\escape-${token}`,
    `./escape-${token}/../../..`,
    `escape-${token}/../../../../../../etc/passwd`,
    `%2e%2e/%2e%2e/escape-${token}`,
    `\u0000/../escape-${token}`,
  ];
}

/** Values of every wrong kind. */
export function hostileValues(token: string): unknown[] {
  return [
    null,
    true,
    false,
    0,
    -1,
    -2147483649,
    2 ** 53 + 2,
    -(2 ** 63),
    1e308,
    -1e308,
    0.5,
    -0,
    "",
    " ",
    "\u0000",
    "A".repeat(70_000),
    "é".repeat(3000),
    "𝔣𝔬𝔯𝔨 ✓ \u202e\u200b",
    "\ud800",
    "\uffff\ufffe",
    "NaN",
    "Infinity",
    "-1",
    "1e999",
    "0x10",
    "null",
    "sb-aaaaaaaaaaaaaaaa",
    "$(touch /tmp/escape-" + token + ")",
    "`id`;;|&",
    ...traversals(token),
    [],
    [null],
    nested(200),
    Array.from({ length: 5000 }, () => "x"),
    {},
    JSON.parse(`{"__proto__": {"polluted": "${token}"}, "constructor": {"prototype": {"x": 1}}}`) as unknown,
  ];
}

type Container = Record<string, unknown> | unknown[];

/** Every place in a JSON value: its parent and key (the root has none). */
function places(v: unknown, parent: Container | null = null, key: string | number | null = null) {
  const out: Array<{ parent: Container | null; key: string | number | null; value: unknown }> = [
    { parent, key, value: v },
  ];
  if (Array.isArray(v)) v.forEach((x, i) => out.push(...places(x, v, i)));
  else if (v && typeof v === "object")
    for (const [k, x] of Object.entries(v as Record<string, unknown>))
      out.push(...places(x, v as Record<string, unknown>, k));
  return out;
}

const EXTRA_KEYS = ["__proto__", "constructor", "extra", "", "é", "a".repeat(300), "tag", "id", "n"];

/** A mutated copy of `value` (1-3 mutations), and what was done. */
export function mutate(r: Rng, value: unknown, token: string): { value: unknown; what: string[] } {
  let root = structuredClone(value);
  const what: string[] = [];
  const hostile = hostileValues(token);
  for (let n = r.pick([1, 1, 1, 1, 2, 2, 3]); n > 0; n--) {
    const all = places(root);
    // The root (the whole body replaced) is one place among many only now and then.
    const p = all.length > 1 && r.chance(0.9) ? r.pick(all.slice(1)) : r.pick(all);
    const kind = r.pick(["replace", "replace", "replace", "drop", "add", "wrap"] as const);
    const h = structuredClone(r.pick(hostile));
    if (p.parent === null) {
      root = kind === "wrap" ? [root] : h;
      what.push(`root=${describe(root)}`);
      continue;
    }
    const at = `${String(p.key)}`;
    if (kind === "drop") {
      if (Array.isArray(p.parent)) p.parent.splice(p.key as number, 1);
      else delete p.parent[p.key as string];
      what.push(`drop ${at}`);
    } else if (kind === "add" && p.value && typeof p.value === "object" && !Array.isArray(p.value)) {
      const k = r.pick(EXTRA_KEYS);
      Object.defineProperty(p.value, k, { value: h, enumerable: true, writable: true, configurable: true });
      what.push(`add ${at}.${k}=${describe(h)}`);
    } else if (kind === "wrap") {
      (p.parent as Record<string, unknown>)[p.key as string] = [p.value];
      what.push(`wrap ${at}`);
    } else {
      (p.parent as Record<string, unknown>)[p.key as string] = h;
      what.push(`${at}=${describe(h)}`);
    }
  }
  return { value: root, what };
}

/** A short description of a value for the report. */
export function describe(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 60 ? `${s.slice(0, 40)}…(${s.length} chars)` : s;
}
