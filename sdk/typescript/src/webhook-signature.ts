/**
 * The check a webhook receiver makes of a forkd delivery (docs/webhooks.md): `forkd-signature`
 * is `v1=` + the hex HMAC-SHA256, under the webhook's secret, of `<forkd-timestamp>.<raw body>`;
 * the timestamp (unix seconds) must be recent, so a recorded delivery cannot be replayed later.
 * De-duplicate on the body's `id` (also `forkd-event-id`): a retried delivery carries the same.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

export interface VerifyWebhookOpts {
  /** How far the timestamp may be from now, in seconds (default 300). */
  toleranceS?: number;
  /** Now, in unix seconds (default: the clock). */
  nowS?: number;
}

/**
 * Whether a delivery is forkd's, unchanged: `headers` as received (lowercase names, as Node
 * gives them), `body` the raw bytes or text as received (not re-serialized JSON).
 */
export function verifyWebhook(
  secret: string,
  headers: Record<string, string | string[] | undefined>,
  body: string | Uint8Array,
  o: VerifyWebhookOpts = {},
): boolean {
  const one = (v: string | string[] | undefined) => (Array.isArray(v) ? v[0] : v);
  const sig = one(headers["forkd-signature"]);
  const ts = one(headers["forkd-timestamp"]);
  if (!sig || !ts || !/^\d{1,12}$/.test(ts)) return false;
  const now = o.nowS ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - Number(ts)) > (o.toleranceS ?? 300)) return false;
  const raw = typeof body === "string" ? Buffer.from(body) : Buffer.from(body);
  const mac = createHmac("sha256", secret).update(`${ts}.`).update(raw).digest("hex");
  const want = Buffer.from(`v1=${mac}`);
  const got = Buffer.from(sig);
  return got.length === want.length && timingSafeEqual(got, want);
}
