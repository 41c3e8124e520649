/**
 * A process's events as E2B's envd streams them (Start's and Connect's replies), from the
 * sandbox's command registry (src/sandbox/commands/): a stream is a queue attached to the
 * command's output as a pacing reader (while its client reads nothing the command's output waits
 * in the guest; the registry cuts a stream that takes nothing for 60 s), and the command's exit
 * is envd's end event. Output with no stream attached is dropped, as E2B's envd drops it.
 */
import type { ExecResult } from "../../agent/index.js";
import type { CommandTap } from "../../sandbox/index.js";
import { ForkdError } from "../../util/index.js";
import { EventQueue } from "./event-queue.js";

/** What a stream of a process carries (the wire's ProcessEvent, before encoding). */
export type ProcEvent =
  | { type: "start"; pid: number }
  | { type: "data"; stream: "stdout" | "stderr" | "pty"; data: Uint8Array }
  | { type: "end"; exitCode: number; exited: boolean; status: string; error?: string };

/** A stream of a command's events from now on (`pty`: its output is envd's pty data). */
export interface ProcessStream {
  queue: EventQueue<ProcEvent>;
  /** The stream's client is gone: the command runs on. */
  detach(): void;
}

/** Attaches a new stream to the output of a command (`tap`); throws past the registry's bound. */
export function processStream(tap: CommandTap, pid: () => number, pty: boolean): ProcessStream {
  const q = new EventQueue<ProcEvent>();
  const out = pty ? "pty" : "stdout";
  const detach = tap.attach({
    paces: true,
    output: (stream, data) =>
      q.push(
        { type: "data", stream: stream === "stdout" ? out : "stderr", data: new Uint8Array(data) },
        data.length,
      ),
    drained: () => q.room(),
    exit: (r) => {
      q.push(endEvent(r));
      q.close();
    },
    error: (e) => q.close(e),
    cut: () =>
      q.close(new ForkdError("resource_exhausted", `process ${pid()}'s stream took nothing for too long`)),
  });
  return {
    queue: q,
    detach: () => {
      detach();
      q.abandon();
    },
  };
}

/** E2B's end event from forkd's exit: Go's ProcessState words ("exit status 1", "signal: killed"). */
export function endEvent(r: ExecResult): ProcEvent {
  if (r.signal !== null) {
    const name = SIGNAL_WORDS[r.signal] ?? `signal ${r.signal}`;
    return { type: "end", exitCode: -1, exited: false, status: `signal: ${name}`, error: `signal: ${name}` };
  }
  const code = r.exitCode ?? -1;
  const status = `exit status ${code}`;
  return { type: "end", exitCode: code, exited: true, status, ...(code !== 0 ? { error: status } : {}) };
}

const SIGNAL_WORDS: Record<number, string> = {
  1: "hangup",
  2: "interrupt",
  3: "quit",
  6: "aborted",
  9: "killed",
  11: "segmentation fault",
  13: "broken pipe",
  14: "alarm clock",
  15: "terminated",
};
