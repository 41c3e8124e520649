/**
 * Webhook signatures. forkd's: `forkd-signature: v1=<hex>`, the HMAC-SHA256 under the webhook's
 * secret of `<forkd-timestamp>.<raw body>` (the timestamp in unix seconds, also sent as its own
 * header), so a receiver can refuse a replay older than its tolerance. E2B's, sent beside it for
 * receivers written for E2B: `e2b-signature`, the unpadded base64 SHA-256 of the secret followed
 * by the raw body (no timestamp: weaker, kept for compatibility only).
 */
import { createHash, createHmac, timingSafeEqual } from "node:crypto";

/** The scheme's version, the prefix of forkd-signature's value. */
export const SIGNATURE_VERSION = "v1";

/** forkd-signature's value for `body` sent at `timestamp` (unix seconds). */
export function signPayload(secret: string, timestamp: number, body: string): string {
  const mac = createHmac("sha256", secret).update(`${timestamp}.${body}`).digest("hex");
  return `${SIGNATURE_VERSION}=${mac}`;
}

/** e2b-signature's value for `body` (E2B's scheme). */
export function e2bSignature(secret: string, body: string): string {
  return createHash("sha256")
    .update(secret + body)
    .digest("base64")
    .replace(/=+$/, "");
}

/**
 * Whether `header` (forkd-signature) signs `body` at `timestamp` under `secret`, and the timestamp
 * is within `toleranceS` of `nowS` (what a receiver checks; the SDK exports the same check).
 */
export function verifySignature(
  secret: string,
  header: string,
  timestamp: string,
  body: string,
  o: { toleranceS?: number; nowS?: number } = {},
): boolean {
  if (!/^\d{1,12}$/.test(timestamp)) return false;
  const ts = Number(timestamp);
  const now = o.nowS ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - ts) > (o.toleranceS ?? 300)) return false;
  const want = Buffer.from(signPayload(secret, ts, body));
  const got = Buffer.from(header);
  return got.length === want.length && timingSafeEqual(got, want);
}
