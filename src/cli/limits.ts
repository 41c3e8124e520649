/** `forkd fork` flags → the API's limits (the daemon validates them). */

export interface LimitFlags {
  memory?: number;
  cpus?: number;
  pids?: number;
  disk?: number;
  /** Seconds. */
  lifetime?: number;
}

/** The request body's `limits`, or undefined when no flag sets one. */
export function limitsFromFlags(o: LimitFlags): Record<string, number> | undefined {
  const l: Record<string, number> = {};
  if (o.memory !== undefined) l.memory_mib = o.memory;
  if (o.cpus !== undefined) l.cpus = o.cpus;
  if (o.pids !== undefined) l.pids = o.pids;
  if (o.disk !== undefined) l.disk_mib = o.disk;
  if (o.lifetime !== undefined) l.lifetime_ms = Math.round(o.lifetime * 1000);
  return Object.keys(l).length > 0 ? l : undefined;
}
