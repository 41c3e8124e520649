/**
 * GET /v1/events through the gateway: the event streams of every node (each opened with the
 * caller's token, so each scopes its own) merged into one, as a daemon's (src/api/routes/events.ts)
 * reads to a client. First one `state`: the nodes' sandboxes (a node whose stream does not start
 * within the listing bound is left out until it does), etcd's `lost` ones, the catalog's
 * snapshots the caller is shown and the nodes' pending ones. Then, as they come: the nodes'
 * `sandbox` and `sandbox-gone`; snapshots from the catalog (`snapshot` when an entry comes or
 * changes, `snapshot-gone` when it goes) and the nodes' pending ones; a sandbox marked lost (a
 * `sandbox` in state lost) and a lost record forgotten (`sandbox-gone`); `usage` of every node
 * together; a `: ping` every 15 s. A node that joins is followed from then on (its `state` told
 * as `sandbox` events), and so is one whose stream ended while it stays in the cluster. A client that reads slower than events come (more than 4 MiB waiting for
 * it) is cut, as a daemon cuts it; a client that hangs up closes every node stream at once.
 */
import type { ServerResponse } from "node:http";
import { mayHold, tagNames } from "../app/index.js";
import type { TagNames } from "../app/index.js";
import type { NodeRecord, SandboxLocation } from "../cluster/index.js";
import type { Authenticated } from "./auth.js";
import { entriesFor, entryFor, entryView } from "./catalog.js";
import type { ClusterChange, Gateway } from "./context.js";
import { credentialHeaders } from "./fan-out.js";
import { openNodeStream } from "./node-stream.js";
import type { NodeEvent, NodeStream } from "./node-stream.js";
import { recordView } from "./record-view.js";

export const EVENTS_MAX_QUEUED = 4 << 20;
export const PING_EVERY_MS = 15_000;
/** A node's stream that ended is opened again after this, while the node is in the cluster. */
const REFOLLOW_MS = 2_000;

type Json = Record<string, unknown>;

class MergedEvents {
  private next = 1;
  private stopped = false;
  private readonly streams = new Map<string, NodeStream>();
  private readonly usage = new Map<string, Json>();
  private readonly names: TagNames;
  private readonly timers: NodeJS.Timeout[] = [];
  private unsubscribe: (() => void) | null = null;
  /** Node events that came before `state` went out, sent after it. */
  private held: [string, unknown][] | null = [];
  /** Changes that came before `state` went out, told after it. */
  private early: ClusterChange[] | null = [];

  constructor(
    private readonly g: Gateway,
    private readonly who: Authenticated,
    private readonly res: ServerResponse,
  ) {
    this.names = tagNames(who.caller);
  }

  async start(): Promise<void> {
    this.res.on("close", () => this.stop());
    this.unsubscribe = this.g.hub.on((c) => (this.early ? this.early.push(c) : this.onChange(c)));
    this.res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-store",
      "x-accel-buffering": "no",
    });
    this.res.flushHeaders();
    const firsts = await Promise.all(this.g.view.nodes().map((n) => this.follow(n)));
    if (this.stopped) return;
    const sandboxes: unknown[] = [];
    const pending = new Map<string, unknown>();
    for (const f of firsts) {
      if (!f) continue;
      if (Array.isArray(f.sandboxes)) sandboxes.push(...(f.sandboxes as unknown[]));
      if (Array.isArray(f.pending))
        for (const p of f.pending as Json[]) if (typeof p.tag === "string") pending.set(p.tag, p);
    }
    for (const r of this.g.view.sandboxes())
      if (r.state === "lost" && this.sees(r)) sandboxes.push(this.view(r));
    const snapshots = entriesFor(this.g, this.who.caller).map((e) => entryView(e, this.who.caller));
    this.send("state", { sandboxes, snapshots, pending: [...pending.values()] });
    const held = this.held ?? [];
    this.held = null;
    for (const [event, data] of held) this.send(event, data);
    const early = this.early ?? [];
    this.early = null;
    for (const c of early) this.onChange(c);
    const ping = setInterval(() => this.write(": ping\n\n"), PING_EVERY_MS);
    ping.unref();
    this.timers.push(ping);
  }

  private sees(r: SandboxLocation): boolean {
    return mayHold(this.who.caller, r.owner);
  }

  private view(r: SandboxLocation): Json {
    return recordView(r, this.names);
  }

  /** Follows `node`'s stream; resolves to its first `state` (null: none in time). */
  private follow(node: NodeRecord): Promise<Json | null> {
    return new Promise((resolve) => {
      let first = true;
      const stream = openNodeStream(
        this.g,
        node,
        "/v1/events",
        credentialHeaders(this.who.authorization),
        (e) => {
          if (first && e.event === "state") {
            first = false;
            return resolve(typeof e.data === "object" && e.data !== null ? (e.data as Json) : {});
          }
          if (!first) this.fromNode(node.id, e);
        },
        () => {
          if (this.streams.get(node.id) === stream) this.streams.delete(node.id);
          this.usage.delete(node.id);
          resolve(null);
          this.again(node.id);
        },
      );
      this.streams.set(node.id, stream);
    });
  }

  /**
   * A node's stream that ended while the node is still in the cluster (it restarted, a
   * connection broke) is followed again after a pause, its `state` told as `sandbox` events.
   */
  private again(id: string): void {
    if (this.stopped) return;
    const t = setTimeout(() => {
      this.timers.splice(this.timers.indexOf(t), 1);
      const node = this.g.view.node(id);
      if (this.stopped || !node || this.streams.has(id)) return;
      void this.follow(node).then((first) => {
        for (const sb of Array.isArray(first?.sandboxes) ? (first.sandboxes as unknown[]) : [])
          this.send("sandbox", sb);
      });
    }, REFOLLOW_MS);
    t.unref();
    this.timers.push(t);
  }

  private fromNode(node: string, e: NodeEvent): void {
    const d = (typeof e.data === "object" && e.data !== null ? e.data : {}) as Json;
    switch (e.event) {
      case "sandbox":
      case "sandbox-gone":
        return this.send(e.event, d);
      case "state":
        // A node's stream started again after ours: its sandboxes one by one.
        for (const sb of Array.isArray(d.sandboxes) ? (d.sandboxes as unknown[]) : [])
          this.send("sandbox", sb);
        return;
      case "snapshot":
        // Ready snapshots are the catalog's to tell; a node tells what it is writing.
        if (d.status !== "ready") this.send("snapshot", d);
        return;
      case "snapshot-gone":
        if (typeof d.tag === "string") void this.goneUnlessCatalogued(d.tag);
        return;
      case "usage":
        this.usage.set(
          node,
          (typeof d.sandboxes === "object" && d.sandboxes !== null ? d.sandboxes : {}) as Json,
        );
        return this.send("usage", { sandboxes: Object.assign({}, ...this.usage.values()) as Json });
    }
  }

  /** A tag a node no longer has is gone only if the catalog has no snapshot of that name for the caller. */
  private async goneUnlessCatalogued(tag: string): Promise<void> {
    const has = await entryFor(this.g, this.who.caller, tag).then(
      () => true,
      () => false,
    );
    if (!has) this.send("snapshot-gone", { tag });
  }

  private onChange(c: ClusterChange): void {
    if (this.stopped) return;
    if (c.sandbox) {
      const { value, previous } = c.sandbox;
      if (value && value.state === "lost" && previous?.state !== "lost" && this.sees(value))
        this.send("sandbox", this.view(value));
      if (!value && previous?.state === "lost" && this.sees(previous))
        this.send("sandbox-gone", { id: previous.id, exit_reason: previous.reason });
    }
    if (c.catalog) {
      const { value, previous } = c.catalog;
      const key = (value ?? previous)?.key;
      if (key === undefined) return;
      const shown = entriesFor(this.g, this.who.caller).find((e) => e.key === key);
      if (value && shown) this.send("snapshot", entryView(shown, this.who.caller));
      if (!value && previous) void this.goneUnlessCatalogued(this.names(previous.key));
    }
    if (c.node) {
      const node = c.node.present ? this.g.view.node(c.node.id) : undefined;
      if (node && !this.streams.has(node.id))
        void this.follow(node).then((first) => {
          for (const sb of Array.isArray(first?.sandboxes) ? (first.sandboxes as unknown[]) : [])
            this.send("sandbox", sb);
        });
    }
  }

  private send(event: string, data: unknown): void {
    // Nothing goes out before `state`: what came meanwhile follows it, in order.
    if (this.held !== null && event !== "state") return void this.held.push([event, data]);
    this.write(`id: ${this.next++}\nevent: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
  }

  private write(text: string): void {
    if (this.stopped || this.res.destroyed) return;
    this.res.write(text);
    // A client this far behind is cut: it reconnects and gets `state` again.
    if (this.res.writableLength > EVENTS_MAX_QUEUED) this.res.destroy();
  }

  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.unsubscribe?.();
    for (const t of this.timers) clearTimeout(t);
    for (const s of [...this.streams.values()]) s.close();
    this.streams.clear();
  }
}

/** Serves `who`'s merged event stream on `res` until the client hangs up. Never throws. */
export function serveEvents(g: Gateway, who: Authenticated, res: ServerResponse): void {
  const m = new MergedEvents(g, who, res);
  m.start().catch((e: unknown) => {
    g.log.warn("gateway: an event stream failed", { error: String(e) });
    m.stop();
    res.destroy();
  });
}
