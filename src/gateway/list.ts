/**
 * GET /v1/sandboxes through the gateway: every node is asked for the same page with the
 * caller's token (each scopes it to the caller), and the pages merge (./merge.ts) with the
 * `lost` records of etcd the caller may see. A node that does not answer in time is shown from
 * etcd's records of its sandboxes (their state as last known), so a listing never drops a
 * node's sandboxes silently. The query is checked here as a daemon checks it; `state` may also
 * name `lost`.
 */
import type { SandboxLocation } from "../cluster/index.js";
import { mayHold, tagNames } from "../app/index.js";
import { ForkdError } from "../util/index.js";
import type { Authenticated } from "./auth.js";
import type { Gateway } from "./context.js";
import { credentialHeaders, fanOut } from "./fan-out.js";
import { mergePages } from "./merge.js";
import type { NodePage } from "./merge.js";
import { replyJson } from "./node-call.js";
import { recordView } from "./record-view.js";

const STATES = new Set(["running", "paused", "exited", "lost"]);
const TOKEN_KEY = /^[^|]{1,64}\|sb-[a-z2-7]{16}$/;

interface ListQuery {
  states: Set<string> | null;
  metadata: string | null;
  limit: number | undefined;
  after: string | null;
}

const bad = (field: string, message: string) => new ForkdError("invalid_argument", message, { field });

export function listQuery(u: URL): ListQuery {
  const state = u.searchParams.get("state");
  const states = state === null ? null : new Set(state.split(","));
  if (states && [...states].some((s) => !STATES.has(s)))
    throw bad("state", "state: running, paused, exited, lost, comma-separated");
  const metadata = u.searchParams.get("metadata");
  if (metadata !== null && metadata.length > 8192) throw bad("metadata", "metadata is over 8192 characters");
  const l = u.searchParams.get("limit");
  const limit = l === null ? undefined : Number(l);
  if (limit !== undefined && (!/^\d{1,4}$/.test(l ?? "") || limit < 1 || limit > 1000))
    throw bad("limit", "limit must be an integer in 1..1000");
  const t = u.searchParams.get("next_token");
  let after: string | null = null;
  if (t !== null) {
    after = t.length > 256 ? "" : Buffer.from(t, "base64url").toString("utf8");
    if (!TOKEN_KEY.test(after)) throw bad("next_token", "next_token is not one this API gave");
  }
  return { states, metadata, limit, after };
}

type View = Record<string, unknown>;
const keyOf = (v: View): string => `${String(v.created)}|${String(v.id)}`;
const tokenOf = (v: View): string => Buffer.from(keyOf(v), "utf8").toString("base64url");

/** The merged page for `who`, as GET /v1/sandboxes answers it. */
export async function listSandboxes(
  g: Gateway,
  who: Authenticated,
  u: URL,
  signal: AbortSignal,
): Promise<{ sandboxes: View[]; next_token: string | null }> {
  const q = listQuery(u);
  const names = tagNames(who.caller);
  const wanted = (r: SandboxLocation) =>
    mayHold(who.caller, r.owner) &&
    (q.states === null || q.states.has(r.state)) &&
    q.metadata === null &&
    (q.after === null || `${r.created}|${r.id}` > q.after);
  const pages: NodePage<View>[] = [];
  const nodeStates = q.states === null ? null : [...q.states].filter((s) => s !== "lost");
  if (nodeStates === null || nodeStates.length > 0) {
    const path = new URL(u.pathname + u.search, "http://gateway");
    if (nodeStates !== null) path.searchParams.set("state", nodeStates.join(","));
    const answers = await fanOut(
      g,
      "rest",
      path.pathname + path.search,
      credentialHeaders(who.authorization),
      signal,
    );
    for (const a of answers) {
      const v =
        a.reply?.status === 200
          ? (replyJson(a.reply) as { sandboxes?: unknown; next_token?: unknown } | null)
          : null;
      if (v && Array.isArray(v.sandboxes)) {
        pages.push({ items: v.sandboxes as View[], more: typeof v.next_token === "string" });
        continue;
      }
      // The node did not answer: its sandboxes as etcd last knew them.
      const own = g.view.sandboxes().filter((r) => r.node === a.node.id && r.state !== "lost" && wanted(r));
      pages.push({ items: own.map((r) => recordView(r, names)), more: false });
    }
  }
  const present = new Set(g.view.nodes().map((n) => n.id));
  const fromEtcd = g.view
    .sandboxes()
    .filter((r) => wanted(r) && (r.state === "lost" || !present.has(r.node)))
    .map((r) => recordView(r, names));
  pages.push({ items: fromEtcd, more: false });
  const m = mergePages(pages, keyOf, q.limit);
  const last = m.items[m.items.length - 1];
  return { sandboxes: m.items, next_token: m.more && last ? tokenOf(last) : null };
}
