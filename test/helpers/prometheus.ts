/**
 * Reads a Prometheus text exposition with an independent parser: the official Python client's
 * (prometheus_client.parser, Debian's python3-prometheus-client), never with the library that
 * wrote it. It is strict: a malformed exposition fails the parse.
 */
import { execFile } from "node:child_process";
import { rawRequest, readAll } from "./http.js";
import type { Endpoint } from "./http.js";

export interface PromSample {
  name: string;
  labels: Record<string, string>;
  value: number;
}
export interface PromFamily {
  name: string;
  type: string;
  samples: PromSample[];
}
export type Families = Map<string, PromFamily>;

/** Debian's interpreter, which has the Debian package (a python3 first on PATH may not). */
const PYTHON = "/usr/bin/python3";

const PY = `
import json, math, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type, "samples": [
        {"name": s.name, "labels": s.labels, "value": s.value if math.isfinite(s.value) else str(s.value)}
        for s in f.samples]})
json.dump(out, sys.stdout)
`;

export function parseMetrics(text: string): Promise<Families> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      PYTHON,
      ["-c", PY],
      { timeout: 30_000, maxBuffer: 64 << 20 },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`the exposition does not parse: ${stderr || err.message}`));
        const families = JSON.parse(stdout) as PromFamily[];
        resolve(new Map(families.map((f) => [f.name, f])));
      },
    );
    child.stdin?.end(text);
  });
}

/** The value of the sample `name` whose labels include `labels` (throws if there is none). */
export function value(m: Families, name: string, labels: Record<string, string> = {}): number {
  for (const f of m.values()) {
    const s = f.samples.find(
      (x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v),
    );
    if (s) return Number(s.value);
  }
  throw new Error(`no sample ${name} with ${JSON.stringify(labels)}`);
}

/** A histogram's observation count. */
export const count = (m: Families, name: string, labels: Record<string, string> = {}): number =>
  value(m, `${name}_count`, labels);

/** Host tool runs a daemon counted (forkd_host_tool_runs), jailed and not, by tool. */
export function hostToolRuns(m: Families): {
  jailed: Record<string, number>;
  unjailed: Record<string, number>;
} {
  const out = { jailed: {} as Record<string, number>, unjailed: {} as Record<string, number> };
  for (const s of m.get("forkd_host_tool_runs")?.samples ?? []) {
    const into = s.labels.jailed === "true" ? out.jailed : out.unjailed;
    into[s.labels.tool ?? "?"] = Number(s.value);
  }
  return out;
}

/** A daemon's host tool runs (hostToolRuns of its GET /metrics). */
export async function daemonToolRuns(ep: Endpoint): Promise<ReturnType<typeof hostToolRuns>> {
  const res = await rawRequest(ep, "GET", "/metrics", undefined, 60_000);
  const text = (await readAll(res)).toString("utf8");
  if (res.statusCode !== 200) throw new Error(`GET /metrics: ${res.statusCode}: ${text}`);
  return hostToolRuns(await parseMetrics(text));
}
