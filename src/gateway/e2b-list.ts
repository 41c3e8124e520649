/**
 * E2B's listings through the gateway, merged from every node's E2B listener (each asked with the
 * caller's API key and the same query, so each scopes and filters its own): GET /sandboxes (v1:
 * every running sandbox), GET /v2/sandboxes (a page by start time and id, newest first unless
 * `order=asc`, X-Next-Token and X-Total-Running as E2B sends them) and GET /snapshots (a page by
 * name). A node's refusal of the query itself (400) is the answer; a node that does not answer
 * is left out.
 */
import type { Authenticated } from "./auth.js";
import type { Gateway } from "./context.js";
import { credentialHeaders, fanOut } from "./fan-out.js";
import { mergePages } from "./merge.js";
import type { NodePage } from "./merge.js";
import { replyJson } from "./node-call.js";
import type { NodeReply } from "./node-call.js";

export interface E2bListReply {
  status: number;
  body: unknown;
  headers: Record<string, string>;
}

type Item = Record<string, unknown>;

const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

function refusalOf(replies: (NodeReply | null)[]): E2bListReply | null {
  const r = replies.find((x) => x !== null && x.status >= 400 && x.status < 500);
  return r ? { status: r.status, body: replyJson(r), headers: {} } : null;
}

export async function e2bList(
  g: Gateway,
  who: Authenticated,
  u: URL,
  signal: AbortSignal,
): Promise<E2bListReply> {
  const answers = await fanOut(g, "e2b", u.pathname + u.search, credentialHeaders(who.authorization), signal);
  const replies = answers.map((a) => a.reply);
  const refused = refusalOf(replies);
  if (refused) return refused;
  const arrays = replies
    .map((r) => (r?.status === 200 ? replyJson(r) : null))
    .map((v) => (Array.isArray(v) ? (v as Item[]) : null));
  const v2 = u.pathname === "/v2/sandboxes";
  const snapshots = u.pathname === "/snapshots";
  if (!v2 && !snapshots) {
    const m = mergePages(
      arrays.map((items) => ({ items: items ?? [], more: false })),
      (s) => String(s.sandboxID),
      undefined,
    );
    return { status: 200, body: m.items, headers: {} };
  }
  const limitRaw = u.searchParams.get("limit");
  const limit = limitRaw === null ? 100 : Number(limitRaw);
  const pages: NodePage<Item>[] = arrays.map((items, i) => ({
    items: items ?? [],
    more: one(replies[i]?.headers["x-next-token"]) !== undefined,
  }));
  if (snapshots) {
    const m = mergePages(pages, (s) => String(s.snapshotID), limit);
    const last = m.items[m.items.length - 1];
    return {
      status: 200,
      body: m.items,
      headers: m.more && last ? { "x-next-token": String(last.snapshotID) } : {},
    };
  }
  const order = u.searchParams.get("order") === "asc" ? "asc" : "desc";
  const key = (s: Item) => `${String(s.startedAt)}|${String(s.sandboxID)}`;
  const m = mergePages(pages, key, limit, order);
  const last = m.items[m.items.length - 1];
  let running = 0;
  for (const r of replies) running += Number(one(r?.headers["x-total-running"]) ?? 0) || 0;
  return {
    status: 200,
    body: m.items,
    headers: {
      "x-total-running": String(running),
      ...(m.more && last ? { "x-next-token": Buffer.from(key(last), "utf8").toString("base64url") } : {}),
    },
  };
}
