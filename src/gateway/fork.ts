/**
 * A fork through the gateway (POST /v1/sandboxes; E2B's create is one child of the same path:
 * ./e2b.ts): the tag resolved in the caller's namespace against the catalog, its children
 * reserved against the tenant's quota across the cluster (src/cluster/quota.ts), placed
 * (src/cluster/placement.ts: warm, held, room; the snapshot's machine only), and sent as one
 * fork per node, in parallel, each with the caller's own request (its body, `n` its part) and
 * bearer token. The answers merge into one ForkResult (./merge.ts): every child, or its failure
 * at the index the caller counts. A node that fails its part as a whole fails each of its
 * children with a message naming it; when the request never reached it (no connection), its
 * children are placed once more on the other nodes. When no child started: a request every node
 * refused the same way (a bad body, a limit) is answered as the first node answered it, else
 * the first failure's code, as a daemon answers a fork whose children all failed.
 */
import { ADMITTED_HEADER } from "../access/index.js";
import { MAX_FORK } from "../sandbox/index.js";
import { place } from "../cluster/index.js";
import type { CatalogEntry, Placement } from "../cluster/index.js";
import { ERROR_CODES, ForkdError, errorMessage } from "../util/index.js";
import type { ErrorCode } from "../util/index.js";
import type { Authenticated } from "./auth.js";
import { entryFor } from "./catalog.js";
import type { Gateway } from "./context.js";
import { mergeFork } from "./merge.js";
import type { ChildFailure, MergedFork, PartOutcome } from "./merge.js";
import { callNode, neverReached, replyJson } from "./node-call.js";
import type { NodeReply } from "./node-call.js";

/** How one part is sent: the node's listener, path and body for `count` children. */
export interface PartRequest {
  door: "rest" | "e2b";
  path: string;
  body: (count: number) => Buffer;
  headers: Record<string, string>;
}

export interface ForkAnswer {
  status: number;
  body: unknown;
  headers?: Record<string, string>;
  /** The raw reply of a one-child fork's node (E2B's create answers with it as it is). */
  reply?: NodeReply;
}

/** Codes that say a node refused the request itself, not that a child failed to start. */
const REFUSALS = new Set([
  "invalid_argument",
  "not_found",
  "forbidden",
  "unauthenticated",
  "payload_too_large",
  "rate_limited",
  "resource_exhausted",
  "conflict",
]);

/** The count of children a fork body asks for (400 past the bounds). */
export function childrenOf(body: Record<string, unknown>): number {
  const n = body.n ?? 1;
  if (typeof n !== "number" || !Number.isInteger(n) || n < 1 || n > MAX_FORK)
    throw new ForkdError("invalid_argument", `n must be an integer in 1..${MAX_FORK}`, { field: "n" });
  return n;
}

interface SentPart {
  node: string;
  offset: number;
  count: number;
  outcome: PartOutcome;
  reply?: NodeReply;
  /** The call never reached the node: its children may go elsewhere. */
  unreached: boolean;
}

function outcomeOf(r: NodeReply): PartOutcome {
  const created = 201;
  const v = replyJson(r) as {
    sandboxes?: unknown;
    failures?: unknown;
    error?: Record<string, unknown>;
  } | null;
  if (r.status === created && v && Array.isArray(v.sandboxes) && Array.isArray(v.failures))
    return { ok: true, sandboxes: v.sandboxes, failures: failuresOf(v.failures) };
  if (r.status === created && v && typeof v === "object" && !("error" in v))
    return { ok: true, sandboxes: [v], failures: [] };
  const err = v?.error;
  if (err && typeof err.code === "string" && typeof err.message === "string") {
    const d = err.details as { failures?: unknown } | undefined;
    return {
      ok: false,
      code: err.code,
      message: err.message,
      ...(Array.isArray(d?.failures) ? { failures: failuresOf(d.failures) } : {}),
    };
  }
  const e2b = v as { code?: unknown; message?: unknown } | null;
  if (e2b && typeof e2b.message === "string")
    return { ok: false, code: codeOfStatus(r.status), message: e2b.message };
  return { ok: false, code: "unavailable", message: `answered status ${r.status} without a result` };
}

const codeOfStatus = (s: number): string =>
  s === 400
    ? "invalid_argument"
    : s === 401
      ? "unauthenticated"
      : s === 403
        ? "forbidden"
        : s === 404
          ? "not_found"
          : s === 409
            ? "conflict"
            : s === 429
              ? "resource_exhausted"
              : s === 504
                ? "timeout"
                : "unavailable";

function failuresOf(v: unknown[]): ChildFailure[] {
  return v.flatMap((f) => {
    const x = f as { index?: unknown; code?: unknown; message?: unknown };
    return typeof x.index === "number" && typeof x.code === "string" && typeof x.message === "string"
      ? [{ index: x.index, code: x.code, message: x.message }]
      : [];
  });
}

/** Sends one part and reads its outcome (never throws). */
async function sendPart(
  g: Gateway,
  p: Placement,
  offset: number,
  req: PartRequest,
  signal: AbortSignal,
): Promise<SentPart> {
  const node = g.view.node(p.node);
  const origin = node ? (req.door === "rest" ? node.api : node.e2b) : null;
  if (!node || origin === null) {
    const message = node ? "it serves no E2B listener" : "it left the cluster";
    return {
      node: p.node,
      offset,
      count: p.count,
      unreached: true,
      outcome: { ok: false, code: "unavailable", message },
    };
  }
  const done = g.assignments.add(p.node, p.count);
  try {
    const r = await callNode(p.node, origin, {
      method: "POST",
      path: req.path,
      // Its children are reserved against the tenant's quota here: the node does not again.
      headers: { ...req.headers, [ADMITTED_HEADER]: `Bearer ${g.admitted}` },
      body: req.body(p.count),
      timeoutMs: g.bounds.forkMs,
      connectMs: g.bounds.connectMs,
      signal,
      pool: g.pool,
      trust: g.nodeTrust,
    });
    g.metrics.placed(p.node, p.count);
    return { node: p.node, offset, count: p.count, unreached: false, reply: r, outcome: outcomeOf(r) };
  } catch (e) {
    const code = e instanceof ForkdError ? e.code : "unavailable";
    g.metrics.nodeFailure(p.node, code === "timeout" ? "timeout" : "unreachable");
    if (neverReached(e)) done(); // nothing started there
    return {
      node: p.node,
      offset,
      count: p.count,
      unreached: neverReached(e),
      outcome: { ok: false, code, message: errorMessage(e).replace(`node ${p.node} `, "") },
    };
  } finally {
    // Answered (or maybe started): counted until the node's record counts them (a no-op once done).
    g.assignments.settle(p.node, done);
  }
}

/** Places `n` children of `e` and sends the parts; unplaced children fail with `extra`. */
async function sendAll(
  g: Gateway,
  e: CatalogEntry,
  n: number,
  req: PartRequest,
  signal: AbortSignal,
): Promise<{ parts: SentPart[]; extra: ChildFailure[] }> {
  const first = place(
    g.view.candidates(e.key, (id) => g.assignments.of(id)),
    n,
    e.machine,
  );
  if (first.placements.length === 0) throw noRoom(g, e);
  let offset = 0;
  const parts = await Promise.all(
    first.placements.map((p) => {
      const at = offset;
      offset += p.count;
      return sendPart(g, p, at, req, signal);
    }),
  );
  const extra: ChildFailure[] = [];
  for (let i = offset; i < n; i++)
    extra.push({
      index: i,
      code: "resource_exhausted",
      message: "no node of the cluster had room for this child",
    });
  // Children whose node was never reached: once more, elsewhere.
  const failed = new Set(parts.filter((p) => p.unreached).map((p) => p.node));
  if (failed.size === 0) return { parts, extra };
  const out: SentPart[] = parts.filter((p) => !p.unreached);
  for (const lost of parts.filter((p) => p.unreached)) {
    const cands = g.view.candidates(e.key, (id) => g.assignments.of(id)).filter((c) => !failed.has(c.id));
    const again = place(cands, lost.count, e.machine);
    if (again.placements.length === 0) {
      out.push(lost);
      continue;
    }
    let at = lost.offset;
    const retried = await Promise.all(
      again.placements.map((p) => {
        const o = at;
        at += p.count;
        return sendPart(g, p, o, req, signal);
      }),
    );
    out.push(...retried);
    for (let i = at; i < lost.offset + lost.count; i++)
      extra.push({
        index: i,
        code: lost.outcome.ok ? "internal" : lost.outcome.code,
        message: `node ${lost.node}: ${lost.outcome.ok ? "" : lost.outcome.message}`,
      });
  }
  return { parts: out, extra };
}

function noRoom(g: Gateway, e: CatalogEntry): ForkdError {
  const m = e.machine;
  const same = g.view
    .nodes()
    .filter(
      (n) =>
        !n.draining && n.machine.accel === m.accel && n.machine.qemu === m.qemu && n.machine.cpu === m.cpu,
    );
  return same.length === 0
    ? new ForkdError(
        "unavailable",
        `no node of the cluster takes work on ${e.key}'s machine (${m.accel}, QEMU ${m.qemu}, CPU ${m.cpu})`,
        { tag: e.key },
      )
    : new ForkdError("resource_exhausted", "no node of the cluster has room for another sandbox", {
        nodes: same.map((n) => n.id),
      });
}

/** A fork of `tag` (the caller's name) for `who`, its parts sent as `req` says. */
export async function forkAcross(
  g: Gateway,
  who: Authenticated,
  tag: string,
  n: number,
  req: PartRequest,
  signal: AbortSignal,
): Promise<ForkAnswer> {
  const started = performance.now();
  const e = await entryFor(g, who.caller, tag);
  const reservation = await g.quota.reserve(who.caller.tenant, who.caller.maxSandboxes, n);
  let merged: MergedFork;
  let parts: SentPart[];
  try {
    const sent = await sendAll(g, e, n, req, signal);
    parts = sent.parts;
    merged = mergeFork(parts, sent.extra);
  } finally {
    await reservation.release();
  }
  const seconds = (performance.now() - started) / 1000;
  if (merged.sandboxes.length > 0) {
    g.metrics.fork(merged.failures.length === 0 ? "ok" : "partial", seconds);
    const one = parts.length === 1 && parts[0]?.reply ? { reply: parts[0].reply } : {};
    return { status: 201, body: merged, ...one };
  }
  g.metrics.fork("failed", seconds);
  const refused = parts.filter((p) => !p.outcome.ok && REFUSALS.has(p.outcome.code) && p.reply);
  const firstReply = refused[0]?.reply;
  if (firstReply && refused.length === parts.length)
    return { status: firstReply.status, body: replyJson(firstReply), reply: firstReply };
  const f = merged.failures[0];
  const code = (ERROR_CODES as readonly string[]).includes(f?.code ?? "")
    ? (f?.code as ErrorCode)
    : "internal";
  throw new ForkdError(code, `every child failed: ${f?.message ?? "unknown"}`, { failures: merged.failures });
}
