/**
 * STREAMS: what a new connection finds in flight in the guest. The agent's stream table lives in
 * the guest's memory and outlives the host's side of it: a sandbox resumed from a pause, one a
 * restarted daemon adopts, a child forked from a branch whose guest ran commands. A new
 * connection's first request asks (on HANDOVER_STREAM, which no host uses for anything else);
 * its streams are then numbered past every id the guest holds, the commands it lists are taken
 * over (exec.ts inheritExec: their output, stdin, signals and exit), and the cells it lists are
 * interrupted (whoever waited for them is gone). The agent itself drops what only the earlier
 * host could finish (writes, reads, watches) and paces the commands again with this
 * connection's window (docs/agent-protocol.md, "Handover"). An agent older than STREAMS
 * answers ENOSYS: nothing is taken over.
 */
import { ForkdError } from "../util/index.js";
import { Msg, Tag } from "./codec.js";
import type { Field } from "./codec.js";
import type { AgentConnection } from "./connection.js";
import { inheritExec } from "./exec.js";
import type { InheritedExec, InheritedExecInfo } from "./exec.js";
import { WINDOW } from "./flow.js";
import { HANDOVER_STREAM, MAX_STREAMS } from "./streams.js";

/** The guest agent's kinds of stream (guest/agent/src/agent.h), as STREAMS lists them. */
const KIND_EXEC = 1;
const KIND_EVAL = 4;
/** A listed command's text is at most this long (the agent keeps 2 KiB of it). */
const CMD_MAX = 4096;
const MAX_ID = HANDOVER_STREAM - 1;

interface Entry {
  stream: number;
  fields: Field[];
}

/** The reply's entries: each STREAM field starts one (the guest sent them: bounded, checked). */
function entries(fields: Field[]): Entry[] {
  const out: Entry[] = [];
  const seen = new Set<number>();
  let cur: Entry | null = null;
  for (const f of fields) {
    if (f.tag === Tag.STREAM) {
      const id = int(f);
      if (!Number.isInteger(id) || id < 1 || id > MAX_ID || seen.has(id))
        throw new ForkdError("agent_protocol", `STREAMS listed an invalid or repeated stream ${id}`);
      if (out.length >= MAX_STREAMS)
        throw new ForkdError("agent_protocol", "STREAMS listed too many streams");
      seen.add(id);
      cur = { stream: id, fields: [] };
      out.push(cur);
    } else cur?.fields.push(f);
  }
  return out;
}

function int(f: Field): number {
  if (f.value.length !== 8)
    throw new ForkdError("agent_protocol", `integer field ${f.tag} has ${f.value.length} bytes`);
  return Number(f.value.readBigInt64BE(0));
}

const one = (e: Entry, tag: number): Field | undefined => e.fields.find((f) => f.tag === tag);
const intOf = (e: Entry, tag: number): number | undefined => {
  const f = one(e, tag);
  return f ? int(f) : undefined;
};
const text = (b: Buffer): string => b.subarray(0, CMD_MAX).toString("utf8");

/** A listed command, as the host takes it over. */
function execInfo(e: Entry): InheritedExecInfo {
  const pid = intOf(e, Tag.PID);
  if (pid === undefined || !Number.isInteger(pid) || pid < 1 || pid > 2 ** 22)
    throw new ForkdError("agent_protocol", `STREAMS listed command ${e.stream} without a valid pid`);
  const shell = one(e, Tag.SHELL);
  const argv = e.fields.filter((f) => f.tag === Tag.ARG).map((f) => text(f.value));
  const ns = intOf(e, Tag.TIME_NS);
  // The guest's clock: kept only when it reads as a time (after 2001, not in the future).
  const startedAt = ns !== undefined && ns > 1e18 && ns / 1e6 <= Date.now() ? new Date(ns / 1e6) : null;
  return {
    stream: e.stream,
    pid,
    cmd: shell ? text(shell.value) : argv.slice(0, 4096),
    pty: intOf(e, Tag.PTY) === 1,
    stdinOpen: intOf(e, Tag.STDIN) === 1,
    startedAt,
    paced: intOf(e, Tag.WINDOW) !== undefined,
  };
}

/**
 * The handover of a new connection: asks the guest what is in flight, numbers this connection's
 * streams past it, takes its commands over and interrupts its cells. Resolves with the commands.
 */
export async function handover(conn: AgentConnection, timeoutMs: number): Promise<InheritedExec[]> {
  let fields: Field[];
  try {
    fields = await conn.request(
      Msg.STREAMS,
      [[Tag.WINDOW, WINDOW]],
      timeoutMs,
      () => undefined,
      HANDOVER_STREAM,
    );
  } catch (e) {
    // An agent older than STREAMS: nothing can be known (nor taken over).
    if (e instanceof ForkdError && e.details.errno === 38) return [];
    throw e;
  }
  const listed = entries(fields);
  for (const e of listed) conn.numberPast(e.stream);
  const execs: InheritedExec[] = [];
  for (const e of listed) {
    const kind = intOf(e, Tag.KIND);
    if (kind === KIND_EXEC) execs.push(inheritExec(conn, execInfo(e)));
    else if (kind === KIND_EVAL) {
      // Its requester is gone: the cell is interrupted, its reply awaited and dropped.
      conn.claim(e.stream, (f) => {
        if (f instanceof ForkdError || f.type === Msg.OK || f.type === Msg.ERROR) conn.end(e.stream);
      });
      conn.send(Msg.EVAL_INTERRUPT, e.stream);
    }
  }
  return execs;
}
