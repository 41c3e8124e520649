/**
 * Starting, stopping and restarting the named processes of a local cluster, keeping its record
 * current: a process's spec is in the record before it starts and its pid right after, so a
 * restart (a node killed -9 and started again on the same data directory, an etcd member, a
 * gateway) runs exactly what `up` ran.
 */
import { ForkdError } from "../util/index.js";
import { launch, running, stop } from "./launch.js";
import { procOf, writeState } from "./state.js";
import type { ClusterState, Proc } from "./state.js";
import { waitServing } from "./waits.js";

/** How long each kind of process may take to serve. */
export interface ServeTimeouts {
  etcdMs: number;
  nodeMs: number;
  gatewayMs: number;
}

export const DEFAULT_TIMEOUTS: ServeTimeouts = { etcdMs: 30_000, nodeMs: 120_000, gatewayMs: 60_000 };

export const timeoutOf = (p: Proc, t: ServeTimeouts): number =>
  p.role === "etcd" ? t.etcdMs : p.role === "node" ? t.nodeMs : t.gatewayMs;

/** Adds `p` to the record (replacing one of its name), then starts it. */
export async function startProc(st: ClusterState, p: Proc): Promise<Proc> {
  const i = st.procs.findIndex((x) => x.name === p.name);
  if (i >= 0) st.procs[i] = p;
  else st.procs.push(p);
  await writeState(st);
  const s = await launch(p);
  p.pid = s.pid;
  p.start = s.start;
  await writeState(st);
  return p;
}

/** Starts the recorded process `name` again (it must not run) and waits until it serves. */
export async function restartProc(
  st: ClusterState,
  name: string,
  t: ServeTimeouts = DEFAULT_TIMEOUTS,
): Promise<Proc> {
  const p = procOf(st, name);
  if (await running(p))
    throw new ForkdError("conflict", `${p.role} ${name} runs already (pid ${p.pid ?? "?"})`);
  await startProc(st, { ...p, pid: null, start: null });
  const started = procOf(st, name);
  await waitServing(started, st.token, timeoutOf(started, t));
  return started;
}

/**
 * Stops the recorded process `name`: SIGTERM (then SIGKILL after `graceMs`), or SIGKILL at once
 * (a crash: a node's VMMs and slots stay behind, as on a host whose daemon died).
 */
export async function stopProc(
  st: ClusterState,
  name: string,
  signal: "SIGTERM" | "SIGKILL" = "SIGTERM",
  graceMs?: number,
): Promise<void> {
  await stop(procOf(st, name), signal, graceMs);
}
