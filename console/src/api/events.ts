/**
 * The daemon's event stream (GET /v1/events, server-sent events) as LiveEvents. EventSource
 * reconnects by itself; a drop is reported as `lost`, and the next `state` replaces everything.
 */
import type { LiveEvent } from "../lib/live-state";

const NAMES = ["state", "sandbox", "sandbox-gone", "snapshot", "snapshot-gone", "usage"] as const;

/** Opens the stream; returns the function that closes it. */
export function subscribe(onEvent: (e: LiveEvent) => void): () => void {
  const es = new EventSource("/v1/events", { withCredentials: true });
  for (const name of NAMES) {
    es.addEventListener(name, (m: MessageEvent<string>) => {
      try {
        const data: unknown = JSON.parse(m.data);
        onEvent({ type: name, data } as LiveEvent);
      } catch {
        /* a malformed event is skipped; the next `state` repairs the view */
      }
    });
  }
  es.onerror = () => onEvent({ type: "lost" });
  return () => es.close();
}
