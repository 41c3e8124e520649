/**
 * A sandbox's metrics as E2B reports them (SandboxMetric): one sample taken now in the guest
 * (CPU use over half a second from /proc/stat, memory from /proc/meminfo, the root file system
 * from df); forkd keeps no history, so `start` and `end` are ignored. A paused sandbox has none.
 */
import { helperExec } from "../envd/helper-env.js";
import type { E2bServices } from "../context.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";

export interface E2bMetric {
  timestamp: string;
  timestampUnix: number;
  cpuCount: number;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

const SCRIPT =
  "head -n1 /proc/stat; sleep 0.5; head -n1 /proc/stat; grep -c '^processor' /proc/cpuinfo; " +
  "cat /proc/meminfo; df -kP / | tail -n1";

export async function sandboxMetrics(s: E2bServices, sb: ReadonlySandbox): Promise<E2bMetric[]> {
  if (sb.state !== "running") return [];
  const out = await s.sandboxes.use(sb.record.id, async (agent) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const h = agent.exec(helperExec({ argv: ["/bin/sh", "-c", SCRIPT], timeoutMs: 10_000 }), {
      onStdout: (b: Buffer) => {
        // The guest says how much; a few KiB are expected, more is not kept.
        size += b.length;
        if (size <= 64 << 10) chunks.push(b);
        return undefined;
      },
    });
    await h.result;
    return Buffer.concat(chunks).toString("utf8");
  });
  return [parseMetrics(out, new Date())];
}

/** The sample from the script's output. */
export function parseMetrics(out: string, at: Date): E2bMetric {
  const lines = out.split("\n");
  const cpu = (l: string | undefined) => (l ?? "").trim().split(/\s+/).slice(1).map(Number);
  const a = cpu(lines[0]);
  const b = cpu(lines[1]);
  const total = (v: number[]) => v.reduce((x, y) => x + (Number.isFinite(y) ? y : 0), 0);
  const idle = (v: number[]) => (v[3] ?? 0) + (v[4] ?? 0);
  const dt = total(b) - total(a);
  const cpuUsedPct = dt > 0 ? Math.round((1000 * (dt - (idle(b) - idle(a)))) / dt) / 10 : 0;
  const mem = new Map<string, number>();
  for (const l of lines) {
    const m = /^(\w+):\s+(\d+) kB/.exec(l);
    if (m?.[1] && m[2]) mem.set(m[1], Number(m[2]) * 1024);
  }
  const memTotal = mem.get("MemTotal") ?? 0;
  const memCache = (mem.get("Cached") ?? 0) + (mem.get("Buffers") ?? 0);
  const memUsed = Math.max(0, memTotal - (mem.get("MemFree") ?? 0) - memCache);
  const df = (lines.filter((l) => l.startsWith("/") || /^\S+\s+\d+\s+\d+\s+\d+/.test(l)).pop() ?? "")
    .trim()
    .split(/\s+/);
  return {
    timestamp: at.toISOString(),
    timestampUnix: Math.floor(at.getTime() / 1000),
    cpuCount: Number(lines[2]) || 1,
    cpuUsedPct,
    memUsed,
    memTotal,
    memCache,
    diskUsed: (Number(df[2]) || 0) * 1024,
    diskTotal: (Number(df[1]) || 0) * 1024,
  };
}
