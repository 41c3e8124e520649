/**
 * GET /v1/events: the daemon's state as server-sent events, scoped to the caller. First `state`
 * (the sandboxes and snapshots GET /v1/sandboxes and GET /v1/snapshots give), then deltas from
 * the event bus (src/events/bus.ts) in the order they happened: `sandbox` (a SandboxView on
 * creation and each state change), `sandbox-gone` ({id, exit_reason}), `snapshot` (a ready
 * SnapshotView, or the SnapshotStatus of one being written or failed), `snapshot-gone` ({tag}, a
 * tag it was shown that was deleted or whose creation ended with nothing);
 * `usage` every 2 s (running sandboxes' CPU and memory on the host: src/events/usage.ts), and a
 * `: ping` comment every 15 s. A client that reads slower than the events come (more than
 * 4 MiB queued for it after `state`, or 1000 sends behind) is disconnected: it reconnects and
 * gets `state` again. A client that
 * hangs up frees its subscription and timers at once.
 */
import { Hono } from "hono";

import type { Caller } from "../../access/index.js";
import type { CoreEvent } from "../../events/index.js";
import { sseComment, sseEvent } from "../../events/index.js";
import { UsageSampler } from "../../events/index.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";
import { readMeta } from "../../snapshot/index.js";
import { errorMessage } from "../../util/index.js";
import type { ApiEnv } from "../env.js";
import { replyStream } from "../../http/index.js";
import type { ReplySink } from "../../http/index.js";
import { mayHold, tagNames, viewerOf, visibleMetas, visiblePending } from "../../app/index.js";
import type { TagNames } from "../../app/index.js";
import { visibleTo } from "../../snapshot/index.js";
import type { Services } from "../../app/index.js";
import { sandboxView } from "../views/sandbox.js";
import { snapshotStatusView, snapshotView } from "../views/snapshot.js";

/** Bytes queued for a client before it counts as too slow and is disconnected. */
export const EVENTS_MAX_QUEUED = 4 << 20;
export const USAGE_EVERY_MS = 2_000;
export const PING_EVERY_MS = 15_000;
/** Sends and samples waiting behind a slow one: a client this far behind is cut. */
const MAX_QUEUED = 1000;

/** The wire form of a snapshot event (null: the tag is neither ready nor pending, or hidden). */
async function snapshotOf(s: Services, caller: Caller, tag: string): Promise<unknown> {
  if (await s.store.has(tag)) {
    const meta = await readMeta(s.store.filesFor(tag).meta).catch(() => null);
    if (meta && visibleTo(viewerOf(caller), tag, meta.owner)) return snapshotView(meta, tagNames(caller));
    if (meta) return null;
  }
  const p = await s.store.pending(tag);
  return p && visibleTo(viewerOf(caller), tag, p.owner) ? snapshotStatusView(p, tagNames(caller)) : null;
}

/** One client's stream: everything it holds, freed by stop(). */
class EventStream {
  private next = 1;
  /** Sends happen one after the other, in the order events came (some need a disk read first). */
  private chain: Promise<void> = Promise.resolve();
  /** Tags and ids this client was shown: only those are told gone. */
  private readonly shownTags = new Set<string>();
  private readonly usage = new UsageSampler();
  private readonly vcpus = new Map<string, number>();
  private readonly timers: NodeJS.Timeout[] = [];
  private unsubscribe: (() => void) | null = null;
  private stopped = false;
  /** How this client is shown store keys. */
  private readonly names: TagNames;

  constructor(
    private readonly s: Services,
    private readonly caller: Caller,
    private readonly sink: ReplySink,
    private readonly cut: () => void,
  ) {
    this.names = tagNames(caller);
  }

  private usagePending = false;
  private queued = 0;

  start(): void {
    // Subscribed before the state is read, so nothing falls between the two.
    this.unsubscribe = this.s.events.subscribe((e) => this.onEvent(e));
    this.sink.onHangup(() => this.stop());
    this.then(async () => {
      // The state may be bigger than the bound (thousands of sandboxes): it is waited out, not
      // counted as a slow reader (which would reconnect and get it again, in a loop). What
      // happens meanwhile waits behind it, bounded by MAX_QUEUED.
      if (!this.sink.write(sseEvent(this.next++, "state", await this.state()))) await this.sink.drained();
    });
    this.timers.push(
      setInterval(() => {
        // One sample at a time: a slow /proc read skips ticks instead of queueing them.
        if (this.usagePending) return;
        this.usagePending = true;
        this.then(async () => {
          try {
            this.send("usage", { sandboxes: await this.sampleUsage() });
          } finally {
            this.usagePending = false;
          }
        });
      }, USAGE_EVERY_MS),
      setInterval(() => this.then(async () => this.write(sseComment("ping"))), PING_EVERY_MS),
    );
  }

  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.unsubscribe?.();
    for (const t of this.timers) clearInterval(t);
  }

  private then(work: () => Promise<void>): void {
    // Work waits in order behind a slow send; a client that far behind is cut (it reconnects).
    if (++this.queued > MAX_QUEUED) {
      this.queued--;
      this.s.log.warn("events: a client fell too far behind", { queued: MAX_QUEUED });
      return this.fail();
    }
    this.chain = this.chain
      .then(async () => {
        if (!this.stopped) await work();
      })
      .finally(() => {
        this.queued--;
      })
      .catch((e: unknown) => {
        this.s.log.warn("events: a send failed", { error: errorMessage(e) });
        this.fail();
      });
  }

  private onEvent(e: CoreEvent): void {
    if (this.stopped) return;
    switch (e.type) {
      case "sandbox": {
        if (!mayHold(this.caller, e.sandbox.record.owner)) return;
        // Its view now, as it is at the change (sent in turn).
        const view = sandboxView(e.sandbox, this.names, this.s.info.node ?? null);
        this.then(async () => this.send("sandbox", view));
        return;
      }
      case "sandbox-gone":
        if (!mayHold(this.caller, e.owner)) return;
        this.then(async () => this.send("sandbox-gone", { id: e.id, exit_reason: e.exitReason }));
        return;
      case "snapshot": {
        // A creation's start is told as it was (it may be over before this send's turn).
        const writing = e.writing;
        if (writing) {
          if (!visibleTo(viewerOf(this.caller), e.tag, writing.owner)) return;
          const view = snapshotStatusView(writing, this.names);
          this.then(async () => {
            this.shownTags.add(e.tag);
            this.send("snapshot", view);
          });
          return;
        }
        this.then(async () => {
          const view = await snapshotOf(this.s, this.caller, e.tag);
          if (view === null) {
            // A tag it was shown that is no longer there (a creation that failed before it
            // had anything, its client watching): told gone. One whose metadata does not read
            // is still there: not.
            if (!(await this.s.store.has(e.tag)) && this.shownTags.delete(e.tag))
              this.send("snapshot-gone", { tag: this.names(e.tag) });
            return;
          }
          this.shownTags.add(e.tag);
          this.send("snapshot", view);
        });
        return;
      }
      case "snapshot-gone":
        this.then(async () => {
          if (!this.shownTags.delete(e.tag)) return;
          this.send("snapshot-gone", { tag: this.names(e.tag) });
        });
        return;
    }
  }

  private async state(): Promise<unknown> {
    const sandboxes = this.s.sandboxes
      .list()
      .filter((sb) => mayHold(this.caller, sb.record.owner))
      .map((sb) => sandboxView(sb, this.names, this.s.info.node ?? null));
    const all = await this.s.snapshots.list();
    const snapshots = visibleMetas(this.caller, all.snapshots);
    const pending = visiblePending(this.caller, all.pending);
    for (const m of snapshots) this.shownTags.add(m.tag);
    for (const p of pending) this.shownTags.add(p.tag);
    return {
      sandboxes,
      snapshots: snapshots.map((m) => snapshotView(m, this.names)),
      pending: pending.map((p) => snapshotStatusView(p, this.names)),
    };
  }

  private async vcpusOf(sb: ReadonlySandbox): Promise<number> {
    if (sb.record.paused) return sb.record.paused.machine.vcpus;
    const known = this.vcpus.get(sb.record.tag);
    if (known !== undefined) return known;
    const meta = await readMeta(this.s.store.filesFor(sb.record.tag).meta).catch(() => null);
    const n = meta?.machine.vcpus ?? 1;
    this.vcpus.set(sb.record.tag, n);
    return n;
  }

  private async sampleUsage(): Promise<unknown> {
    const running = this.s.sandboxes
      .list()
      .filter((sb) => sb.state === "running" && mayHold(this.caller, sb.record.owner));
    const targets = [];
    for (const sb of running)
      targets.push({ id: sb.record.id, pid: sb.record.pid, vcpus: await this.vcpusOf(sb) });
    return this.usage.sample(targets);
  }

  private send(event: string, data: unknown): void {
    this.write(sseEvent(this.next++, event, data));
  }

  private write(bytes: Uint8Array): void {
    if (this.stopped) return;
    // write() says false once the queue is past its bound: this reader is too slow.
    if (!this.sink.write(bytes)) this.fail();
  }

  private fail(): void {
    this.stop();
    this.sink.fail(new Error("the events client reads too slowly"));
    this.cut();
  }
}

export function eventRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();
  app.get("/", (c) => {
    const caller = c.get("caller");
    const outgoing = c.env?.outgoing;
    const body = replyStream(
      (sink) => {
        if (sink.gone) return;
        new EventStream(s, caller, sink, () => outgoing?.destroy()).start();
      },
      { outgoing, highWaterMark: EVENTS_MAX_QUEUED },
    );
    return new Response(body, {
      status: 200,
      headers: {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-store",
        "x-accel-buffering": "no",
      },
    });
  });
  return app;
}
