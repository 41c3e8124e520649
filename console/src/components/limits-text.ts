/** A sandbox's host-side limits in one short line. */
import type { Sandbox } from "../api/types";
import { duration } from "../lib/format";

export function limitsText(l: Sandbox["limits"]): string {
  const parts: string[] = [];
  if (l.memory_mib !== null) parts.push(`${l.memory_mib} MiB`);
  if (l.cpus !== null) parts.push(`${l.cpus} CPU`);
  if (l.pids !== null) parts.push(`${l.pids} pids`);
  if (l.disk_mib !== null) parts.push(`disk ${l.disk_mib} MiB`);
  if (l.lifetime_ms !== null) parts.push(`life ${duration(l.lifetime_ms)}`);
  return parts.length === 0 ? "none" : parts.join(", ");
}
