/**
 * Lifecycle webhooks: their definitions (create, list, delete; a tenant's see its own sandboxes,
 * an operator's every one) and their delivery. Events come off the daemon's event bus
 * (lifecycle.ts) and are queued per webhook, in memory and on disk (queue.ts); nothing is sent
 * on the path that emitted them. Delivery runs apart: at most `concurrency` attempts at once over
 * all webhooks, one at a time per webhook, each cut off at `timeoutMs` (post.ts); a failed one is
 * retried with backoff (backoff.ts) until `maxAttempts`, then dropped and counted; a webhook that
 * answers again gets its backlog at once. Files: <dir>/webhooks.json, <dir>/queue/<id>.json.
 */
import { mkdir } from "node:fs/promises";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import type { EventBus } from "../events/index.js";
import { assertReachable, connectCheck, tenantGuard } from "../registry/index.js";
import type { TenantGuard } from "../registry/index.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { Logger } from "../util/index.js";
import { retryDelayMs } from "./backoff.js";
import { newSecret, newWebhookId, readDefs, writeDefs } from "./definitions.js";
import type { WebhookDef } from "./definitions.js";
import { LIFECYCLE_EVENTS, LifecycleTracker } from "./lifecycle.js";
import type { LifecycleEvent, LifecycleType } from "./lifecycle.js";
import { eventType, payloadOf } from "./payload.js";
import { postOnce } from "./post.js";
import { WebhookQueue } from "./queue.js";
import type { QueuedEvent } from "./queue.js";
import { SIGNATURE_VERSION, e2bSignature, signPayload } from "./signature.js";
import type { WebhookSettings } from "./settings.js";

/** A webhook's delivery state since the daemon started (its queue's size survives restarts). */
export interface WebhookState {
  queued: number;
  delivered: number;
  failedAttempts: number;
  dropped: number;
  lastDeliveryAt: string | null;
  lastError: string | null;
  lastErrorAt: string | null;
}

/** A webhook as shown (never its secret). */
export type WebhookInfo = Omit<WebhookDef, "secret"> & { state: WebhookState };

/** Counted over all webhooks since start: what /metrics shows. */
export interface WebhookStats {
  delivered: number;
  failedAttempts: number;
  /** Dropped because their webhook's queue was full (the oldest go). */
  droppedOverflow: number;
  /** Dropped after their last attempt failed. */
  droppedAttempts: number;
  queued: number;
  webhooks: number;
}

export interface CreateWebhook {
  url: string;
  name?: string;
  /** Empty or absent: every lifecycle event. */
  events?: LifecycleType[];
  secret?: string;
  enabled?: boolean;
}

export interface WebhookOptions {
  /** <data>/webhooks. */
  dir: string;
  events: EventBus;
  /** The sandboxes there now (known at start, not told created). */
  sandboxes: () => readonly ReadonlySandbox[];
  /** Whether a snapshot key is published (a branch finished). */
  isReady: (tag: string) => Promise<boolean>;
  log: Logger;
  settings: WebhookSettings;
  /** This cluster node's id (null: alone), put in each event. */
  node: string | null;
  /** A tenant's webhook's address check (default: public addresses and the operator's hosts). */
  guard?: TenantGuard;
  random?: () => number;
}

interface Hook {
  def: WebhookDef;
  url: URL;
  queue: WebhookQueue;
  state: WebhookState;
  busy: boolean;
  timer: NodeJS.Timeout | null;
  deleted: boolean;
}

const refuse = (url: URL, what: string): ForkdError =>
  new ForkdError(
    "forbidden",
    `${what}: refusing ${url.host}: a tenant's webhook may post only to a public address ` +
      `(not loopback, link-local, private or this host's own), or a host the operator allows (FORKD_TENANT_WEBHOOK_HOSTS)`,
    { host: url.host },
  );

export class WebhookService {
  private readonly hooks = new Map<string, Hook>();
  private readonly waiting = new Set<string>();
  private active = 0;
  private closed = false;
  private unsubscribe: (() => void) | null = null;
  private readonly guard: TenantGuard;
  private readonly random: () => number;
  private readonly inFlight = new Set<Promise<void>>();
  /** Ends attempts under way when the daemon stops. */
  private readonly stopping = new AbortController();
  /** Definition changes, one at a time (each writes the whole file). */
  private defsChain: Promise<unknown> = Promise.resolve();
  readonly stats: WebhookStats = {
    delivered: 0,
    failedAttempts: 0,
    droppedOverflow: 0,
    droppedAttempts: 0,
    queued: 0,
    webhooks: 0,
  };

  constructor(private readonly o: WebhookOptions) {
    this.guard = o.guard ?? tenantGuard(o.settings.allowedHosts);
    this.random = o.random ?? Math.random;
  }

  private get defsPath(): string {
    return join(this.o.dir, "webhooks.json");
  }

  private queuePath(id: string): string {
    return join(this.o.dir, "queue", `${id}.json`);
  }

  /** Reads the definitions and their queues, subscribes to the bus, and sends what was left. */
  async start(): Promise<void> {
    await mkdir(join(this.o.dir, "queue"), { recursive: true, mode: 0o700 });
    for (const def of await readDefs(this.defsPath)) await this.load(def);
    const tracker = new LifecycleTracker(this.o.isReady, (e) => this.onLifecycle(e));
    tracker.seed(this.o.sandboxes());
    this.unsubscribe = this.o.events.subscribe((e) => tracker.onEvent(e));
    for (const id of this.hooks.keys()) this.kick(id);
  }

  private async load(def: WebhookDef): Promise<Hook> {
    const queue = await WebhookQueue.open(this.queuePath(def.id), this.o.settings.maxQueue, (e) =>
      this.o.log.warn("webhooks: queue file", { webhook: def.id, error: errorMessage(e) }),
    );
    const hook: Hook = {
      def,
      url: new URL(def.url),
      queue,
      state: {
        queued: queue.size,
        delivered: 0,
        failedAttempts: 0,
        dropped: 0,
        lastDeliveryAt: null,
        lastError: null,
        lastErrorAt: null,
      },
      busy: false,
      timer: null,
      deleted: false,
    };
    this.hooks.set(def.id, hook);
    this.stats.webhooks = this.hooks.size;
    return hook;
  }

  /** Stops sending: attempts under way are ended (their events stay queued), queues are written. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.unsubscribe?.();
    for (const h of this.hooks.values()) if (h.timer) clearTimeout(h.timer);
    this.stopping.abort();
    await Promise.allSettled([...this.inFlight]);
    await Promise.all([...this.hooks.values()].map((h) => h.queue.flush()));
  }

  // ------------------------------------------------------------------ definitions

  /** Webhooks `tenant` manages (null: an admin, every one). */
  list(tenant: string | null): WebhookInfo[] {
    return [...this.hooks.values()]
      .filter((h) => tenant === null || h.def.tenant === tenant)
      .sort((a, b) => a.def.created.localeCompare(b.def.created))
      .map((h) => this.info(h));
  }

  /** Webhook `id` if `tenant` manages it (another tenant's is not found, as one that does not exist). */
  get(tenant: string | null, id: string): WebhookInfo {
    return this.info(this.own(tenant, id));
  }

  private own(tenant: string | null, id: string): Hook {
    const h = this.hooks.get(id);
    if (!h || (tenant !== null && h.def.tenant !== tenant))
      throw new ForkdError("not_found", `no webhook ${id}`, { webhook_id: id });
    return h;
  }

  private info(h: Hook): WebhookInfo {
    const { secret: _secret, ...rest } = h.def;
    return { ...rest, events: [...rest.events], state: { ...h.state, queued: h.queue.size } };
  }

  /**
   * A webhook of `tenant` (null: an operator's, told of every sandbox). Its secret is the one
   * given, or a new one: returned here only.
   */
  async create(tenant: string | null, c: CreateWebhook): Promise<{ info: WebhookInfo; secret: string }> {
    const url = parseWebhookUrl(c.url);
    // Before the turn: a slow name lookup holds no other creation.
    if (tenant !== null) await assertReachable(url, this.guard, "webhook", refuse);
    return this.serial(() => this.createNow(tenant, c, url));
  }

  /** Runs `fn` after every definition change before it (failed or not). */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.defsChain.then(fn, fn);
    this.defsChain = p.catch(() => undefined);
    return p;
  }

  private async createNow(
    tenant: string | null,
    c: CreateWebhook,
    url: URL,
  ): Promise<{ info: WebhookInfo; secret: string }> {
    if (this.closed) throw new ForkdError("unavailable", "the daemon is stopping");
    if (tenant !== null) {
      const n = [...this.hooks.values()].filter((h) => h.def.tenant === tenant).length;
      if (n >= this.o.settings.maxPerTenant)
        throw new ForkdError(
          "resource_exhausted",
          `tenant ${tenant} has ${n} webhooks, the most it may have (FORKD_WEBHOOK_MAX_PER_TENANT)`,
        );
    }
    const events = [...new Set(c.events && c.events.length > 0 ? c.events : LIFECYCLE_EVENTS)];
    const def: WebhookDef = {
      id: newWebhookId(),
      name: c.name ?? "",
      url: url.toString(),
      events: LIFECYCLE_EVENTS.filter((t) => events.includes(t)),
      tenant,
      enabled: c.enabled ?? true,
      secret: c.secret ?? newSecret(),
      created: new Date().toISOString(),
    };
    await writeDefs(this.defsPath, [...[...this.hooks.values()].map((h) => h.def), def]);
    const hook = await this.load(def);
    this.o.log.info("webhook created", { id: def.id, tenant, host: url.host, events: def.events });
    return { info: this.info(hook), secret: def.secret };
  }

  /** Deletes webhook `id` of `tenant`'s: its undelivered events go with it. */
  delete(tenant: string | null, id: string): Promise<WebhookInfo> {
    return this.serial(() => this.deleteNow(tenant, id));
  }

  private async deleteNow(tenant: string | null, id: string): Promise<WebhookInfo> {
    const h = this.own(tenant, id);
    await writeDefs(
      this.defsPath,
      [...this.hooks.values()].filter((x) => x !== h).map((x) => x.def),
    );
    this.hooks.delete(id);
    this.waiting.delete(id);
    this.stats.webhooks = this.hooks.size;
    h.deleted = true;
    if (h.timer) clearTimeout(h.timer);
    const shown = this.info(h);
    await h.queue.destroy();
    this.o.log.info("webhook deleted", { id, tenant: h.def.tenant });
    return shown;
  }

  // ------------------------------------------------------------------ delivery

  private onLifecycle(e: LifecycleEvent): void {
    if (this.closed) return;
    for (const h of this.hooks.values()) {
      if (!h.def.enabled || !h.def.events.includes(e.type)) continue;
      if (h.def.tenant !== null && h.def.tenant !== e.owner) continue;
      const id = randomUUID();
      const body = JSON.stringify(
        payloadOf(e, { id, webhookId: h.def.id, tenant: h.def.tenant, node: this.o.node }),
      );
      const now = Date.now();
      const over = h.queue.push({ id, type: eventType(e.type), body, queued: now, attempts: 0, next: now });
      if (over > 0) {
        h.state.dropped += over;
        this.stats.droppedOverflow += over;
        this.o.log.warn("webhooks: queue full, oldest events dropped", { webhook: h.def.id, dropped: over });
      }
      this.kick(h.def.id);
    }
  }

  /** Sends webhook `id`'s next due event if a slot is free; else waits for its time or a slot. */
  private kick(id: string): void {
    const h = this.hooks.get(id);
    if (!h || this.closed || h.busy) return;
    if (h.timer) clearTimeout(h.timer);
    h.timer = null;
    const next = h.queue.first();
    if (!next) return;
    const wait = next.next - Date.now();
    if (wait > 0) {
      h.timer = setTimeout(() => this.kick(id), Math.min(wait, 2 ** 31 - 1));
      h.timer.unref();
      return;
    }
    if (this.active >= this.o.settings.concurrency) {
      this.waiting.add(id);
      return;
    }
    this.active++;
    h.busy = true;
    const p = this.attempt(h, next)
      .catch((e: unknown) => this.o.log.warn("webhooks: attempt failed", { error: errorMessage(e) }))
      .finally(() => {
        this.inFlight.delete(p);
        this.active--;
        h.busy = false;
        this.kick(id);
        this.kickWaiting();
      });
    this.inFlight.add(p);
  }

  private kickWaiting(): void {
    for (const id of [...this.waiting]) {
      if (this.active >= this.o.settings.concurrency) return;
      this.waiting.delete(id);
      this.kick(id);
    }
  }

  private async attempt(h: Hook, ev: QueuedEvent): Promise<void> {
    const ts = Math.floor(Date.now() / 1000);
    const attempt = ev.attempts + 1;
    const headers = {
      "user-agent": "forkd-webhooks",
      "forkd-webhook-id": h.def.id,
      "forkd-event-id": ev.id,
      "forkd-event-type": ev.type,
      "forkd-delivery-attempt": String(attempt),
      "forkd-timestamp": String(ts),
      "forkd-signature": signPayload(h.def.secret, ts, ev.body),
      "e2b-webhook-id": h.def.id,
      "e2b-delivery-id": `${ev.id}-${attempt}`,
      "e2b-signature-version": SIGNATURE_VERSION,
      "e2b-signature": e2bSignature(h.def.secret, ev.body),
    };
    let lookup;
    let r;
    try {
      lookup = h.def.tenant === null ? undefined : connectCheck(h.url, this.guard, "webhook", refuse);
      r = await postOnce(h.url, headers, ev.body, {
        timeoutMs: this.o.settings.timeoutMs,
        signal: this.stopping.signal,
        ...(lookup ? { lookup } : {}),
      });
    } catch (e) {
      r = { ok: false, error: errorMessage(e) };
    }
    if (h.deleted) return;
    const now = Date.now();
    if (r.ok) {
      h.queue.remove(ev.id);
      h.state.delivered++;
      this.stats.delivered++;
      h.state.lastDeliveryAt = new Date(now).toISOString();
      // It answers again: what waits for a retry is due now.
      let back = false;
      for (const x of h.queue.list())
        if (x.attempts > 0 && x.next > now) {
          x.next = now;
          back = true;
        }
      if (back) h.queue.changed();
      return;
    }
    // Cut by the stop: not an attempt of the receiver's; sent again at the next start.
    if (this.closed) return;
    ev.attempts = attempt;
    h.state.failedAttempts++;
    this.stats.failedAttempts++;
    h.state.lastError = r.error ?? "failed";
    h.state.lastErrorAt = new Date(now).toISOString();
    if (attempt >= this.o.settings.retry.maxAttempts) {
      h.queue.remove(ev.id);
      h.state.dropped++;
      this.stats.droppedAttempts++;
      this.o.log.warn("webhooks: event dropped after its last attempt", {
        webhook: h.def.id,
        event: ev.id,
        attempts: attempt,
        error: h.state.lastError,
      });
      return;
    }
    ev.next = now + retryDelayMs(attempt, this.o.settings.retry, this.random);
    h.queue.changed();
  }

  /** Queued events over all webhooks now. */
  queued(): number {
    let n = 0;
    for (const h of this.hooks.values()) n += h.queue.size;
    return n;
  }
}

/** A webhook's URL: http or https, no credentials in it, no fragment. */
export function parseWebhookUrl(text: string): URL {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new ForkdError("invalid_argument", `webhook url ${JSON.stringify(text)} is not a URL`, {
      field: "url",
    });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new ForkdError("invalid_argument", "webhook url: only http and https", { field: "url" });
  if (url.username !== "" || url.password !== "")
    throw new ForkdError(
      "invalid_argument",
      "webhook url: no credentials in it (the signature authenticates)",
      {
        field: "url",
      },
    );
  url.hash = "";
  return url;
}
