/**
 * Snapshot routes through the gateway. Reads come from the catalog (tags are cluster-wide): GET
 * /v1/snapshots lists the entries the caller is shown, with the snapshots nodes are writing or
 * failed to write (each node's `pending`, asked with the caller's token); GET
 * /v1/snapshots/{tag} is the entry's view, and a tag the catalog does not have (an async branch
 * still being written) is asked of the nodes. Every other snapshot route goes to one node: a
 * holder of the snapshot (its origin first) for what reads or changes it (info, pack, push,
 * compact, delete), the node with the most room for what makes one (create, build, unpack,
 * pull). A branch is a sandbox's route: its node (./rest.ts).
 */
import type { IncomingMessage } from "node:http";
import { noSnapshot } from "../app/index.js";
import { mostRoom } from "../cluster/index.js";
import type { NodeRecord } from "../cluster/index.js";
import { ForkdError } from "../util/index.js";
import type { Authenticated } from "./auth.js";
import { entriesFor, entryFor, entryView, holdersOf } from "./catalog.js";
import type { Gateway } from "./context.js";
import { credentialHeaders, fanOut } from "./fan-out.js";
import { replyJson } from "./node-call.js";
import type { NodeReply } from "./node-call.js";

/** GET /v1/snapshots: the catalog's, and what nodes are writing. */
export async function listSnapshots(
  g: Gateway,
  who: Authenticated,
  signal: AbortSignal,
): Promise<{ snapshots: unknown[]; pending: unknown[] }> {
  const snapshots = entriesFor(g, who.caller)
    .map((e) => entryView(e, who.caller))
    .sort((a, b) => (String(a.tag) < String(b.tag) ? -1 : String(a.tag) > String(b.tag) ? 1 : 0));
  const shown = new Set(snapshots.map((s) => (s as { tag: string }).tag));
  const pending = new Map<string, unknown>();
  for (const a of await fanOut(g, "rest", "/v1/snapshots", credentialHeaders(who.authorization), signal)) {
    const v = a.reply?.status === 200 ? (replyJson(a.reply) as { pending?: unknown } | null) : null;
    if (!v || !Array.isArray(v.pending)) continue;
    for (const p of v.pending as { tag?: unknown }[])
      if (typeof p.tag === "string" && !shown.has(p.tag) && !pending.has(p.tag)) pending.set(p.tag, p);
  }
  return { snapshots, pending: [...pending.values()] };
}

/**
 * GET /v1/snapshots/{tag}: the catalog entry's view; else the first node that knows the tag
 * (its reply, to relay as it is); else 404.
 */
export async function getSnapshot(
  g: Gateway,
  who: Authenticated,
  tag: string,
  signal: AbortSignal,
): Promise<{ view: unknown } | { reply: NodeReply }> {
  try {
    return { view: entryView(await entryFor(g, who.caller, tag), who.caller) };
  } catch (e) {
    if (!(e instanceof ForkdError) || e.code !== "not_found") throw e;
  }
  const path = `/v1/snapshots/${encodeURIComponent(tag)}`;
  for (const a of await fanOut(g, "rest", path, credentialHeaders(who.authorization), signal))
    if (a.reply?.status === 200) return { reply: a.reply };
  throw noSnapshot(tag);
}

/** The node a snapshot route goes to: `tag`'s holder, or the node with the most room. */
export async function snapshotNode(
  g: Gateway,
  who: Authenticated,
  req: IncomingMessage,
  tag: string | null,
): Promise<NodeRecord> {
  if (tag === null) {
    const id = mostRoom(g.view.candidates(null, (n) => g.assignments.of(n)));
    const node = id === null ? undefined : g.view.node(id);
    if (!node) throw new ForkdError("unavailable", "no node of the cluster takes work now");
    return node;
  }
  const e = await entryFor(g, who.caller, tag);
  const node = holdersOf(g, e)[0];
  if (!node)
    throw new ForkdError("unavailable", `no node of the cluster holds ${tag} now (${req.method} needs one)`, {
      tag,
    });
  return node;
}
