/**
 * The webhooks defined on this daemon, in <data>/webhooks/webhooks.json (0600: it holds their
 * secrets), written whole and atomically at each change. What a webhook is: where it posts,
 * which lifecycle events, whose sandboxes (a tenant's, or every one for an operator's), its secret.
 */
import { readFile } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { z } from "zod";
import { TENANT_RE, newRandomId, writeJsonAtomic } from "../util/index.js";
import { LIFECYCLE_EVENTS } from "./lifecycle.js";

/** Webhook ids: "wh-" + 16 lowercase base32 characters. */
export const WEBHOOK_ID_RE = /^wh-[a-z2-7]{16}$/;

export const WebhookDefSchema = z.object({
  id: z.string().regex(WEBHOOK_ID_RE),
  name: z.string().max(256),
  url: z.string().max(2048),
  events: z.array(z.enum(LIFECYCLE_EVENTS)).max(LIFECYCLE_EVENTS.length),
  /** Whose sandboxes it is told of: a tenant's; null: every sandbox (an operator's). */
  tenant: z.string().regex(TENANT_RE).nullable(),
  enabled: z.boolean(),
  secret: z.string().min(16).max(256),
  created: z.string().max(64),
});
export type WebhookDef = z.infer<typeof WebhookDefSchema>;

const FileSchema = z.object({ webhooks: z.array(WebhookDefSchema).max(100_000) });

export const newWebhookId = (): string => newRandomId("wh-");

/** A generated secret: 32 random bytes, shown once at creation. */
export const newSecret = (): string => `whsec_${randomBytes(32).toString("base64url")}`;

/** The definitions at `path` (none: none; unreadable: the error, the daemon must not start blind). */
export async function readDefs(path: string): Promise<WebhookDef[]> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw e;
  }
  return FileSchema.parse(JSON.parse(text)).webhooks;
}

export async function writeDefs(path: string, defs: readonly WebhookDef[]): Promise<void> {
  await writeJsonAtomic(path, { webhooks: defs }, 0o600);
}
