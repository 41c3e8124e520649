/** A parser for the Prometheus text exposition format (0.0.4): samples with their labels and the metric types. */

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Exposition {
  samples: Sample[];
  /** Metric family name → its # TYPE (counter, gauge, histogram, summary, untyped). */
  types: Record<string, string>;
}

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$/;
const LABEL = /\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?/y;

function unescape(v: string): string {
  return v.replace(/\\(.)/g, (_m, c: string) => (c === "n" ? "\n" : c));
}

function parseLabels(text: string): Record<string, string> | null {
  const labels: Record<string, string> = {};
  LABEL.lastIndex = 0;
  let at = 0;
  while (at < text.length) {
    LABEL.lastIndex = at;
    const m = LABEL.exec(text);
    if (!m || m[1] === undefined || m[2] === undefined) return text.slice(at).trim() === "" ? labels : null;
    labels[m[1]] = unescape(m[2]);
    at = LABEL.lastIndex;
  }
  return labels;
}

function parseValue(v: string): number {
  if (v === "+Inf") return Infinity;
  if (v === "-Inf") return -Infinity;
  return Number(v);
}

export function parseExposition(text: string): Exposition {
  const samples: Sample[] = [];
  const types: Record<string, string> = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "") continue;
    if (line.startsWith("#")) {
      const t = /^#\s*TYPE\s+(\S+)\s+(\S+)/.exec(line);
      if (t?.[1] && t[2]) types[t[1]] = t[2];
      continue;
    }
    const m = LINE.exec(line);
    if (!m || m[1] === undefined || m[4] === undefined) continue;
    const labels = m[3] === undefined ? {} : parseLabels(m[3]);
    if (labels === null) continue;
    samples.push({ name: m[1], labels, value: parseValue(m[4]) });
  }
  return { samples, types };
}

/** A stable key for one series: its name and sorted labels, as Prometheus writes them. */
export function seriesKey(s: Sample): string {
  const l = Object.keys(s.labels)
    .sort()
    .map((k) => `${k}="${s.labels[k] ?? ""}"`)
    .join(",");
  return l === "" ? s.name : `${s.name}{${l}}`;
}

/** The family a sample belongs to (histogram and summary samples carry a suffix). */
export function familyOf(name: string, types: Record<string, string>): string {
  if (types[name]) return name;
  for (const suffix of ["_bucket", "_sum", "_count", "_total", "_created"])
    if (name.endsWith(suffix) && types[name.slice(0, -suffix.length)]) return name.slice(0, -suffix.length);
  return name;
}
