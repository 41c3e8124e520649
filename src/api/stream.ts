/**
 * Long operations with ?stream=1: NDJSON lines {"type":"progress","message", phase?, layer?,
 * done_bytes?, total_bytes?} (src/util/progress.ts), then
 * {"type":"done", <key>: result} or {"type":"error", "error": …} (the one error envelope).
 * Errors found before the work starts should be thrown before calling this, so they get a status.
 * A reader slower than the progress loses progress lines, counted (paced-progress.ts), never the
 * final event.
 *
 * By default the client only watches: if it hangs up, the work is not abandoned (a push, a
 * pull). It runs to its end, and its outcome goes to the daemon's log (the work may also record
 * it: `watcher.gone`). With `cancel`, a hang-up is the client's Ctrl-C (a snapshot's creation,
 * as `docker build`): `watcher.signal` aborts and the work stops and leaves nothing.
 */
import type { Logger } from "../util/index.js";
import type { Progress } from "../util/index.js";
import { errorMessage } from "../util/index.js";
import type { ApiContext } from "./env.js";
import { toEnvelope } from "./errors.js";
import { pacedProgress } from "./paced-progress.js";
import { replyStream } from "../http/index.js";

/** Whether anyone still watches the work's progress. */
export interface Watcher {
  readonly gone: boolean;
  /** Aborts when the client hangs up, if the work is cancelled then (`cancel`). */
  readonly signal: AbortSignal;
}

/**
 * Aborts when the client of a plain (not streamed) reply hangs up before it is sent: its
 * connection closes while the work still runs.
 */
export function hangupSignal(c: ApiContext): AbortSignal {
  const ac = new AbortController();
  const res = c.env?.outgoing;
  res?.once("close", () => {
    if (!res.writableFinished) ac.abort();
  });
  return ac.signal;
}

export function progressStream<T>(
  c: ApiContext,
  status: number,
  key: string,
  what: string,
  log: Logger,
  work: (progress: Progress, watcher: Watcher) => Promise<T>,
  onHangup: "go-on" | "cancel" = "go-on",
): Response {
  const stream = replyStream(
    (sink) => {
      const ac = new AbortController();
      sink.onHangup(() => {
        log.info(`${what}: its client went away; ${onHangup === "cancel" ? "cancelled" : "it goes on"}`);
        if (onHangup === "cancel") ac.abort();
      });
      const watcher: Watcher = {
        get gone() {
          return sink.gone;
        },
        signal: ac.signal,
      };
      const p = Promise.resolve().then(() => work(pacedProgress(sink), watcher));
      p.then(
        (result) => {
          if (sink.gone) log.info(`${what}: done (its client had gone)`);
          sink.line({ type: "done", [key]: result });
          sink.end();
        },
        (e: unknown) => {
          if (sink.gone) log.warn(`${what}: failed (its client had gone)`, { error: errorMessage(e) });
          sink.line({ type: "error", ...toEnvelope(e).body });
          sink.end();
        },
      ).catch((e: unknown) => log.warn(`${what}: reply not sent`, { error: errorMessage(e) }));
    },
    { outgoing: c.env?.outgoing },
  );
  return new Response(stream, { status, headers: { "content-type": "application/x-ndjson" } });
}

/**
 * A creation's reply (201): its result as JSON, or with ?stream=1 (`streamed`) progress lines and
 * then the result under `key`. Either way a client that hangs up before the result is sent
 * cancels the work (`signal`: its Ctrl-C, as `docker build`'s), which then leaves nothing.
 */
export async function creationReply<T extends object>(
  c: ApiContext,
  streamed: boolean,
  key: string,
  what: string,
  log: Logger,
  work: (signal: AbortSignal, progress?: Progress) => Promise<T>,
): Promise<Response> {
  if (!streamed) return c.json(await work(hangupSignal(c)), 201);
  return progressStream(
    c,
    201,
    key,
    what,
    log,
    (progress, watcher) => work(watcher.signal, progress),
    "cancel",
  );
}
