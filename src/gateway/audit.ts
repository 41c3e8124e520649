/**
 * GET /v1/audit through the gateway: each node keeps the audit log of the calls it served, so
 * every node is asked with the caller's token and query (each scopes and filters its own), and
 * the lines merge by time, newest last, cut to the `limit` newest (default 100, at most 1000).
 * A node that does not answer in time is left out, and the reply's `missing` names it.
 */
import { ForkdError } from "../util/index.js";
import type { Authenticated } from "./auth.js";
import type { Gateway } from "./context.js";
import { credentialHeaders, fanOut } from "./fan-out.js";
import { replyJson } from "./node-call.js";
import type { NodeReply } from "./node-call.js";

export async function mergedAudit(
  g: Gateway,
  who: Authenticated,
  u: URL,
  signal: AbortSignal,
): Promise<{ lines: unknown[]; missing?: string[] } | { reply: NodeReply }> {
  const l = u.searchParams.get("limit");
  if (l !== null && (!/^\d{1,4}$/.test(l) || Number(l) < 1 || Number(l) > 1000))
    throw new ForkdError("invalid_argument", "limit must be an integer in 1..1000", { field: "limit" });
  const limit = l === null ? 100 : Number(l);
  const lines: { ts: string }[] = [];
  const missing: string[] = [];
  for (const a of await fanOut(
    g,
    "rest",
    u.pathname + u.search,
    credentialHeaders(who.authorization),
    signal,
  )) {
    if (a.reply && a.reply.status !== 200 && a.reply.status < 500) return { reply: a.reply }; // the query's own error
    const v = a.reply?.status === 200 ? (replyJson(a.reply) as { lines?: unknown } | null) : null;
    if (!v || !Array.isArray(v.lines)) {
      missing.push(a.node.id);
      continue;
    }
    for (const line of v.lines as { ts?: unknown }[])
      if (typeof line.ts === "string") lines.push(line as { ts: string });
  }
  lines.sort((a, b) => (a.ts < b.ts ? -1 : a.ts > b.ts ? 1 : 0));
  return { lines: lines.slice(Math.max(0, lines.length - limit)), ...(missing.length ? { missing } : {}) };
}
