/**
 * One page of GET /v1/sandboxes: filtered by state and metadata (E2B's query: metadata as the
 * URL-encoded `k=v&k2=v2` its SDKs send), in a stable order (creation time, then id), cut at
 * `limit`. The next token names the last sandbox of the page, so a page is never repeated or
 * skipped when sandboxes come and go between calls.
 */
import { ForkdError } from "../../util/index.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";

export interface PageQuery {
  state?: string;
  metadata?: string;
  limit?: number;
  next_token?: string;
}

const key = (sb: ReadonlySandbox): string => `${sb.record.created}|${sb.record.id}`;

function tokenOf(sb: ReadonlySandbox): string {
  return Buffer.from(key(sb), "utf8").toString("base64url");
}

function afterOf(token: string): string {
  const k = Buffer.from(token, "base64url").toString("utf8");
  if (!/^[^|]{1,64}\|sb-[a-z2-7]{16}$/.test(k))
    throw new ForkdError("invalid_argument", "next_token is not one this daemon gave", {
      field: "next_token",
    });
  return k;
}

export function listPage(
  all: readonly ReadonlySandbox[],
  q: PageQuery,
): { items: ReadonlySandbox[]; nextToken: string | null } {
  const states = q.state ? new Set(q.state.split(",")) : null;
  const want = q.metadata ? [...new URLSearchParams(q.metadata)] : [];
  const after = q.next_token ? afterOf(q.next_token) : null;
  const matching = all
    .filter((sb) => !states || states.has(sb.state))
    .filter((sb) => want.every(([k, v]) => sb.record.metadata?.[k] === v))
    .filter((sb) => after === null || key(sb) > after)
    .sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  if (q.limit === undefined || matching.length <= q.limit) return { items: matching, nextToken: null };
  const items = matching.slice(0, q.limit);
  const last = items[items.length - 1];
  return { items, nextToken: last ? tokenOf(last) : null };
}
