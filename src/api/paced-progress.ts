/**
 * The progress of streamed work written to a reply that may be read slowly: while the reply is
 * over its high-water mark (sink.line() said to wait), progress lines are dropped and counted,
 * not queued, and once the reader has caught up one line says how many were dropped. The work
 * never waits for its watcher, and a slow reader cannot make the daemon's memory grow without
 * bound. Only progress is dropped: the final done or error event is written by the caller.
 */
import type { Progress } from "../util/index.js";
import type { ReplySink } from "../http/index.js";

export function pacedProgress(sink: Pick<ReplySink, "line" | "drained" | "done">): Progress {
  let waiting = false;
  let dropped = 0;
  const wait = (): void => {
    waiting = true;
    void sink.drained().then(() => {
      waiting = false;
      if (dropped === 0 || sink.done) return;
      const message = `${dropped} progress lines dropped (the client reads slower than they come)`;
      dropped = 0;
      if (!sink.line({ type: "progress", message })) wait();
    });
  };
  return (message, detail) => {
    if (sink.done) return;
    if (waiting) dropped++;
    else if (!sink.line({ type: "progress", message, ...detail })) wait();
  };
}
