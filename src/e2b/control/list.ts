/**
 * Listing sandboxes as E2B does (GET /v2/sandboxes): the caller's running and paused ones,
 * filtered by state (comma-separated), metadata (`k=v&k2=v2`, each key and value URL-encoded),
 * template and start time, ordered by start time (newest first unless `asc`), in pages of
 * `limit` whose `nextToken` (the X-Next-Token header) names where the next page starts.
 */
import type { Caller } from "../../access/index.js";
import type { E2bServices } from "../context.js";
import { mayHold, tagNames } from "../../app/index.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";
import { ForkdError } from "../../util/index.js";
import { listedView } from "./views.js";
import type { E2bListedSandbox, MachineCache } from "./views.js";

export interface ListOptions {
  metadata?: string;
  state?: string;
  limit: number;
  nextToken?: string;
  order?: "asc" | "desc";
  startedAfter?: string;
  template?: string;
}

const bad = (message: string): ForkdError => new ForkdError("invalid_argument", message);

/** The metadata query: pairs that must all match. */
export function parseMetadataQuery(q: string): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  for (const [k, v] of new URLSearchParams(q)) {
    try {
      pairs.push([decodeURIComponent(k), decodeURIComponent(v)]);
    } catch {
      throw bad(`metadata: ${JSON.stringify(k)} is not URL-encoded`);
    }
  }
  return pairs;
}

/** A page's cursor: the start time and id of the last sandbox it holds. */
const cursorOf = (sb: ReadonlySandbox): string =>
  Buffer.from(`${sb.record.created}|${sb.record.id}`, "utf8").toString("base64url");

function parseCursor(t: string): { created: string; id: string } {
  const [created, id, ...rest] = Buffer.from(t, "base64url").toString("utf8").split("|");
  if (created === undefined || id === undefined || rest.length > 0 || !Number.isFinite(Date.parse(created)))
    throw bad("nextToken: not a token this API gave");
  return { created, id };
}

export async function listSandboxes(
  s: E2bServices,
  caller: Caller,
  o: ListOptions,
): Promise<{ items: E2bListedSandbox[]; nextToken: string | null; running: number }> {
  const names = tagNames(caller);
  const states = new Set(
    (o.state ?? "running,paused")
      .split(",")
      .map((x) => x.trim())
      .filter(Boolean),
  );
  for (const st of states)
    if (st !== "running" && st !== "paused")
      throw bad(`state: ${JSON.stringify(st)} is not running or paused`);
  const meta = o.metadata ? parseMetadataQuery(o.metadata) : [];
  const after = o.startedAfter === undefined ? null : Date.parse(o.startedAfter);
  if (after !== null && !Number.isFinite(after)) throw bad("startedAfter: not a time");
  const asc = o.order === "asc";
  const mine = s.sandboxes.list().filter((sb) => sb.state !== "exited" && mayHold(caller, sb.record.owner));
  const running = mine.filter((sb) => sb.state === "running").length;
  const key = (sb: ReadonlySandbox) => `${sb.record.created}|${sb.record.id}`;
  const all = mine
    .filter((sb) => states.has(sb.state))
    .filter((sb) => meta.every(([k, v]) => sb.record.metadata?.[k] === v))
    .filter((sb) => o.template === undefined || names(sb.record.tag) === o.template)
    .filter((sb) => after === null || Date.parse(sb.record.created) >= after)
    .sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (asc ? 1 : -1));
  let from = 0;
  if (o.nextToken) {
    const c = parseCursor(o.nextToken);
    const k = `${c.created}|${c.id}`;
    from = all.findIndex((sb) => (asc ? key(sb) > k : key(sb) < k));
    if (from < 0) from = all.length;
  }
  const page = all.slice(from, from + o.limit);
  const last = page[page.length - 1];
  const more = from + page.length < all.length;
  const cache: MachineCache = new Map();
  return {
    items: await Promise.all(page.map((sb) => listedView(s, sb, names, cache))),
    nextToken: more && last ? cursorOf(last) : null,
    running,
  };
}
