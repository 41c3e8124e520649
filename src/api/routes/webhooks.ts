/**
 * Lifecycle webhooks (src/webhooks): list, create, show, delete. A tenant's caller manages its own
 * (told of its own sandboxes); an admin's creates operator-wide ones (told of every sandbox) and
 * sees every one. The secret is shown in the creation's reply only; the audit log records the
 * webhook's id, never its secret or URL's query.
 */
import { Hono } from "hono";
import { z } from "zod";
import type { Services } from "../../app/index.js";
import { ForkdError } from "../../util/index.js";
import { LIFECYCLE_EVENTS } from "../../webhooks/index.js";
import type { LifecycleType, WebhookInfo, WebhookService } from "../../webhooks/index.js";
import { CreateWebhook, WebhookId } from "../contract/schemas.js";
import { noteTarget } from "../env.js";
import type { ApiEnv } from "../env.js";
import { parseBody, parseParams } from "../parse.js";

/** The wire form of a webhook (snake_case state). */
export function webhookView(w: WebhookInfo): Record<string, unknown> {
  return {
    id: w.id,
    name: w.name,
    url: w.url,
    events: w.events,
    tenant: w.tenant,
    enabled: w.enabled,
    created: w.created,
    state: {
      queued: w.state.queued,
      delivered: w.state.delivered,
      failed_attempts: w.state.failedAttempts,
      dropped: w.state.dropped,
      last_delivery_at: w.state.lastDeliveryAt,
      last_error: w.state.lastError,
      last_error_at: w.state.lastErrorAt,
    },
  };
}

/** E2B's event names (sandbox.lifecycle.created) as forkd's (created); unknown ones are refused. */
function eventNames(list: string[] | undefined): LifecycleType[] | undefined {
  if (!list) return undefined;
  const known = new Set<string>(LIFECYCLE_EVENTS);
  return list.map((n) => {
    const short = n.replace(/^sandbox\.lifecycle\./, "");
    if (!known.has(short))
      throw new ForkdError("invalid_argument", `unknown webhook event ${JSON.stringify(n)}`, {
        field: "events",
      });
    return short as LifecycleType;
  });
}

export function webhookRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();
  const service = (): WebhookService => {
    if (!s.webhooks) throw new ForkdError("unavailable", "webhooks are not served by this daemon");
    return s.webhooks;
  };

  app.get("/", (c) => c.json({ webhooks: service().list(c.get("caller").tenant).map(webhookView) }));

  app.post("/", async (c) => {
    const b = await parseBody(c, CreateWebhook);
    const events = eventNames(b.events);
    const r = await service().create(c.get("caller").tenant, {
      url: b.url,
      ...(b.name !== undefined ? { name: b.name } : {}),
      ...(events !== undefined ? { events } : {}),
      ...(b.secret !== undefined ? { secret: b.secret } : {}),
      ...(b.enabled !== undefined ? { enabled: b.enabled } : {}),
    });
    noteTarget(c, "webhook_id", r.info.id);
    return c.json({ ...webhookView(r.info), secret: r.secret }, 201);
  });

  app.get("/:webhook_id", (c) => {
    const { webhook_id } = parseParams(c, z.object({ webhook_id: WebhookId }));
    return c.json(webhookView(service().get(c.get("caller").tenant, webhook_id)));
  });

  app.delete("/:webhook_id", async (c) => {
    const { webhook_id } = parseParams(c, z.object({ webhook_id: WebhookId }));
    return c.json(webhookView(await service().delete(c.get("caller").tenant, webhook_id)));
  });

  return app;
}
