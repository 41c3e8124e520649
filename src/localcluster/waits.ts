/**
 * Waiting for a process of a local cluster to serve: its probe URL answers 200 (etcd's /health
 * once the member has a leader; a node's or gateway's GET /v1/health), each try and the whole
 * wait bounded. A process that exits, or does not serve in time, fails the wait with an error
 * naming it, the last answer, and the tail of its log.
 */
import { ForkdError, errorMessage, readFileTail, sleep } from "../util/index.js";
import { running } from "./launch.js";
import type { Proc } from "./state.js";

const TRY_MS = 2_000;

/** The last lines of a log (at most 4 KiB), indented, for an error message. */
export async function logTail(path: string, lines = 15): Promise<string> {
  const t = await readFileTail(path, 4096);
  if (!t) return `  (no log at ${path})`;
  const text = t.bytes.toString("utf8").trimEnd().split("\n").slice(-lines);
  return text.map((l) => `  | ${l}`).join("\n");
}

/** One GET of `url`: null when it answered 200, else why not. */
export async function probe(url: string, token: string | null): Promise<string | null> {
  try {
    const r = await fetch(url, {
      headers: token ? { authorization: `Bearer ${token}` } : {},
      signal: AbortSignal.timeout(TRY_MS),
    });
    const body = await r.text();
    return r.status === 200 ? null : `HTTP ${r.status}: ${body.slice(0, 200)}`;
  } catch (e) {
    const cause = (e as { cause?: unknown }).cause;
    return cause ? errorMessage(cause) : errorMessage(e);
  }
}

/** Waits until `p` serves (at most `timeoutMs`). */
export async function waitServing(p: Proc, token: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "not tried";
  for (;;) {
    const why = await probe(p.probe, p.auth ? token : null);
    if (why === null) return;
    last = why;
    if (!(await running(p)))
      throw new ForkdError(
        "unavailable",
        `${p.role} ${p.name} exited before it served (${p.log}):\n${await logTail(p.log)}`,
      );
    if (Date.now() > deadline)
      throw new ForkdError(
        "timeout",
        `${p.role} ${p.name} did not serve ${p.probe} within ${Math.round(timeoutMs / 1000)} s ` +
          `(last: ${last}; ${p.log}):\n${await logTail(p.log)}`,
      );
    await sleep(200);
  }
}
