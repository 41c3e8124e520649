/**
 * A node's server-sent event stream (its GET /v1/events) read by the gateway: each event (name
 * and JSON data) told as it comes; a line longer than the bound, a reply that is not a stream,
 * or a node that took no connection in time ends it (`onEnd` once, with why). close() ends it
 * from this side. The stream is registered under its node, so the node leaving the cluster
 * ends it at once. An https node's stream comes over TLS (./upstream-of.ts).
 */
import type { ClientRequest } from "node:http";
import type { NodeRecord } from "../cluster/index.js";
import { requestTo } from "../http/index.js";
import { errorMessage } from "../util/index.js";
import type { Gateway } from "./context.js";
import { upstreamOf } from "./upstream-of.js";

export interface NodeEvent {
  event: string;
  data: unknown;
}

/** The longest event line accepted from a node. */
const MAX_LINE = 16 << 20;

/** Parses server-sent events from chunks of text (comments and ids are dropped). */
export class SseParser {
  private buf = "";
  private event = "message";
  private data: string[] = [];

  /** Feeds `chunk`; the events it completes. Throws past MAX_LINE. */
  feed(chunk: string): NodeEvent[] {
    this.buf += chunk;
    const out: NodeEvent[] = [];
    for (;;) {
      const nl = this.buf.indexOf("\n");
      if (nl < 0) break;
      const line = this.buf.slice(0, nl).replace(/\r$/, "");
      this.buf = this.buf.slice(nl + 1);
      if (line === "") {
        if (this.data.length > 0) {
          try {
            out.push({ event: this.event, data: JSON.parse(this.data.join("\n")) });
          } catch {
            // a malformed event is skipped
          }
        }
        this.event = "message";
        this.data = [];
      } else if (line.startsWith("event:")) this.event = line.slice(6).trim();
      else if (line.startsWith("data:")) this.data.push(line.slice(5).replace(/^ /, ""));
    }
    if (this.buf.length > MAX_LINE) throw new Error("an event line over the bound");
    return out;
  }
}

export interface NodeStream {
  close(): void;
}

/** Opens `node`'s `path` as an event stream with `headers`. */
export function openNodeStream(
  g: Gateway,
  node: NodeRecord,
  path: string,
  headers: Record<string, string>,
  onEvent: (e: NodeEvent) => void,
  onEnd: (why: string) => void,
): NodeStream {
  let ended = false;
  let req: ClientRequest | null = null;
  const end = (why: string) => {
    if (ended) return;
    ended = true;
    clearTimeout(timer);
    unregister();
    req?.destroy();
    onEnd(why);
  };
  const unregister = g.relays.open(node.id, () => end(`node ${node.id} left the cluster`));
  const timer = setTimeout(() => end(`node ${node.id} did not start its stream in time`), g.bounds.listMs);
  try {
    req = requestTo(upstreamOf(node.api, g.nodeTrust), { method: "GET", path, headers, agent: false });
  } catch (e) {
    end(errorMessage(e));
    return { close: () => undefined };
  }
  req.on("error", (e) => end(`node ${node.id}: ${errorMessage(e)}`));
  req.on("response", (r) => {
    clearTimeout(timer);
    if (r.statusCode !== 200 || !/^text\/event-stream/.test(r.headers["content-type"] ?? "")) {
      r.resume();
      return end(`node ${node.id} answered ${String(r.statusCode)}`);
    }
    const parser = new SseParser();
    r.setEncoding("utf8");
    r.on("data", (chunk: string) => {
      if (ended) return;
      try {
        for (const e of parser.feed(chunk)) onEvent(e);
      } catch (e) {
        end(`node ${node.id}: ${errorMessage(e)}`);
      }
    });
    r.on("error", () => end(`node ${node.id}'s stream broke off`));
    r.on("close", () => end(`node ${node.id}'s stream ended`));
  });
  req.end();
  return { close: () => end("closed") };
}
