/**
 * The daemon's event stream (GET /v1/events, server-sent events) as LiveEvents. A drop (or an
 * error reply: a 502 while the daemon restarts) is reported as `lost`, and a new connection is
 * opened after a delay that grows to 10 s. Each connection's first event, `state`, replaces
 * everything. EventSource cannot send the session's key: each connection's URL carries a fresh
 * single-use ticket, which is why EventSource's own retry (the same URL) is not used.
 */
import type { LiveEvent } from "../lib/live-state";
import { withTicket } from "./http";

const NAMES = ["state", "sandbox", "sandbox-gone", "snapshot", "snapshot-gone", "usage"] as const;
const RETRY_MIN_MS = 1000;
const RETRY_MAX_MS = 10_000;

/** Opens the stream (and reopens it while wanted); returns the function that closes it. */
export function subscribe(onEvent: (e: LiveEvent) => void): () => void {
  let es: EventSource | null = null;
  let retry: ReturnType<typeof setTimeout> | undefined;
  let delay = RETRY_MIN_MS;
  let closed = false;
  const retryLater = () => {
    retry = setTimeout(() => {
      if (!closed) open();
    }, delay);
    delay = Math.min(RETRY_MAX_MS, delay * 2);
  };
  const open = () => {
    withTicket("/v1/events").then(
      (url) => {
        if (closed) return;
        const source = new EventSource(url, { withCredentials: true });
        es = source;
        for (const name of NAMES) {
          source.addEventListener(name, (m: MessageEvent<string>) => {
            if (name === "state") delay = RETRY_MIN_MS;
            try {
              const data: unknown = JSON.parse(m.data);
              onEvent({ type: name, data } as LiveEvent);
            } catch {
              /* a malformed event is skipped; the next `state` repairs the view */
            }
          });
        }
        source.onerror = () => {
          onEvent({ type: "lost" });
          // Its own retry would bring a used ticket: a new connection instead.
          source.close();
          if (!closed) retryLater();
        };
      },
      () => {
        onEvent({ type: "lost" });
        if (!closed) retryLater();
      },
    );
  };
  open();
  return () => {
    closed = true;
    clearTimeout(retry);
    es?.close();
  };
}
