/**
 * How the REST edge ends what a revoked credential opened (src/access/open-streams.ts): a
 * streamed reply gets a last line saying why and ends (NDJSON: an `{"type":"error"}` line;
 * server-sent events: an `error` event; each after a newline if a line was cut), while a byte
 * stream (a download, a pack) is cut, so a truncated file never looks whole; a WebSocket (a
 * terminal) gets an `{"type":"error"}` text frame and closes 1008, and is cut if its client does
 * not answer the close within CLOSE_GRACE_MS. Ending a reply cancels the work feeding it, as a
 * client's hang-up does (an exec's command is killed, an event stream's subscription freed).
 */
import type { Transformer } from "node:stream/web";
import type { WebSocket } from "ws";
import type { EndOpened } from "../access/index.js";
import type { ForkdError } from "../util/index.js";
import { toEnvelope } from "./errors.js";
import type { WsUpgrade } from "../http/index.js";

/** How long a closed WebSocket's client has to answer the close before its socket is cut. */
export const CLOSE_GRACE_MS = 2_000;

const enc = new TextEncoder();
const NEWLINE = 10;

/** The last bytes of a reply of `type` that was ended because `why`; null: cut it instead. */
export function endingOf(type: string, why: ForkdError): Uint8Array | null {
  const envelope = toEnvelope(why).body;
  if (/^application\/x-ndjson/.test(type))
    return enc.encode(JSON.stringify({ type: "error", ...envelope }) + "\n");
  if (/^text\/event-stream/.test(type))
    return enc.encode(`event: error\ndata: ${JSON.stringify(envelope)}\n\n`);
  return null;
}

/**
 * A pass-through for a streamed reply of `type` that `register` may end early (it is given the
 * ending and returns what unregisters it); `done` is called once when the reply ends in any way.
 */
export function revocableReply(
  type: string,
  register: (end: EndOpened) => () => void,
  done: () => void,
): TransformStream<Uint8Array, Uint8Array> {
  let lineOpen = false;
  let unregister: (() => void) | null = null;
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    unregister?.();
    done();
  };
  const transformer: Transformer<Uint8Array, Uint8Array> & { cancel: () => void } = {
    start(controller) {
      unregister = register((why) => {
        try {
          const ending = endingOf(type, why);
          if (ending === null) controller.error(why);
          else {
            if (lineOpen) controller.enqueue(enc.encode("\n"));
            controller.enqueue(ending);
            // Closes the reply and cancels what feeds it.
            controller.terminate();
          }
        } catch {
          /* already ended */
        }
        finish();
      });
    },
    transform(chunk, controller) {
      if (chunk.length > 0) lineOpen = chunk[chunk.length - 1] !== NEWLINE;
      controller.enqueue(chunk);
    },
    flush: finish,
    // `cancel` (the client went away) is called by Node's streams though older typings omit it.
    cancel: finish,
  };
  return new TransformStream<Uint8Array, Uint8Array>(transformer);
}

/** Ends a WebSocket because `why`: an error frame, a 1008 close, cut if not answered in time. */
export function endSocket(ws: WebSocket, why: ForkdError): void {
  if (ws.readyState !== ws.OPEN) return void ws.terminate();
  ws.send(JSON.stringify({ type: "error", ...toEnvelope(why).body }));
  ws.close(1008, "credential revoked");
  setTimeout(() => ws.terminate(), CLOSE_GRACE_MS).unref();
}

/** An upgrade whose socket, once open, is registered with `register` until it closes. */
export function revocableUpgrade(up: WsUpgrade, register: (end: EndOpened) => () => void): void {
  const accept = up.accept.bind(up);
  up.accept = (onOpen) =>
    accept((ws) => {
      const unregister = register((why) => endSocket(ws, why));
      ws.once("close", unregister);
      onOpen(ws);
    });
}
