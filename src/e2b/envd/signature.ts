/**
 * Signed file URLs of secure sandboxes, checked as E2B's SDK makes them (downloadUrl,
 * uploadUrl): `signature` = "v1_" + unpadded base64 of SHA-256 over
 * `path:operation:username:accessToken[:expiration]`, `signature_expiration` in Unix seconds.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";

export type FileOperation = "read" | "write";

/** The signature the SDK computes for these values. */
export function fileSignature(
  path: string,
  operation: FileOperation,
  username: string,
  accessToken: string,
  expiration: number | null,
): string {
  const raw =
    expiration === null
      ? `${path}:${operation}:${username}:${accessToken}`
      : `${path}:${operation}:${username}:${accessToken}:${expiration}`;
  return "v1_" + createHash("sha256").update(raw, "utf8").digest("base64").replace(/=+$/, "");
}

/** Whether `url`'s signature grants `operation` with `accessToken` now (an expired one does not). */
export function signatureValid(
  url: URL,
  operation: FileOperation,
  accessToken: string,
  nowMs = Date.now(),
): boolean {
  const sig = url.searchParams.get("signature");
  if (!sig || sig.length > 128) return false;
  const expRaw = url.searchParams.get("signature_expiration");
  let exp: number | null = null;
  if (expRaw !== null) {
    if (!/^\d{1,12}$/.test(expRaw)) return false;
    exp = Number(expRaw);
    if (exp * 1000 < nowMs) return false;
  }
  const want = fileSignature(
    url.searchParams.get("path") ?? "",
    operation,
    url.searchParams.get("username") ?? "",
    accessToken,
    exp,
  );
  const a = Buffer.from(sig);
  const b = Buffer.from(want);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * Which of `accessTokens` (a sandbox's tokens, one per API key that may have been given one)
 * signed `req`, a GET (read) or POST (write) of envd's /files: its index, or -1.
 */
export function signedFileRequest(
  req: IncomingMessage,
  t: { port: number },
  accessTokens: readonly string[],
  nowMs = Date.now(),
): number {
  if (t.port !== 49983 || (req.method !== "GET" && req.method !== "POST")) return -1;
  const url = new URL(req.url ?? "/", "http://envd");
  if (url.pathname !== "/files" || !url.searchParams.has("signature")) return -1;
  const op = req.method === "GET" ? "read" : "write";
  return accessTokens.findIndex((token) => token !== "" && signatureValid(url, op, token, nowMs));
}
