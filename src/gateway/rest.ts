/**
 * forkd's REST API on a gateway (FORKD_GATEWAY_LISTEN; docs/cluster.md, "Gateway"): every
 * request is authenticated here (./auth.ts: a bearer token, or the console's session) and then:
 *
 *   /v1/sandboxes/{id}/...            the node that holds the sandbox (its record's node), relayed
 *                                     with the caller's token (exec and its streams, files, watch,
 *                                     ports, branch, the terminal's WebSocket ...); a lost one is
 *                                     answered from its record (./sandbox-route.ts)
 *   POST /v1/sandboxes                placed and fanned out (./fork.ts)
 *   GET /v1/sandboxes, /v1/audit      merged from every node (./list.ts, ./audit.ts)
 *   GET /v1/events                    every node's stream merged (./events.ts)
 *   GET /v1/snapshots[/{tag}]         the catalog (./snapshots.ts); other snapshot routes: a holder,
 *                                     or the node with the most room
 *   /v1/tokens, /v1/version,          one node (tokens are the cluster's, in etcd)
 *   /v1/openapi.json
 *   /v1/health, /v1/nodes, /metrics   the gateway's own; /v1/console/*, /console/: ./console.ts
 *
 * Nothing here throws into the listener: every failure is the error envelope.
 */
import type { IncomingMessage, RequestListener, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { ANONYMOUS, isAdmin } from "../access/index.js";
import { mayHold, noSandbox, tagNames } from "../app/index.js";
import { forgetLost, mostRoom } from "../cluster/index.js";
import { sendJson } from "../http/index.js";
import { ForkdError, SANDBOX_ID_RE, errorMessage } from "../util/index.js";
import { mergedAudit } from "./audit.js";
import { restCaller } from "./auth.js";
import type { Authenticated } from "./auth.js";
import { consoleRoute, isConsoleAsset, serveConsoleAsset } from "./console.js";
import type { Gateway } from "./context.js";
import { serveEvents } from "./events.js";
import { childrenOf, forkAcross } from "./fork.js";
import { listSandboxes } from "./list.js";
import { nodesView } from "./nodes.js";
import { recordView } from "./record-view.js";
import { relay, relayUpgrade } from "./relay.js";
import { envelope, jsonObject, rawReply, readBody } from "./reply.js";
import { routeSandbox } from "./sandbox-route.js";
import { getSnapshot, listSnapshots, snapshotNode } from "./snapshots.js";

const SANDBOX = /^\/v1\/sandboxes\/([^/]+)(\/.*)?$/;
const SNAPSHOT = /^\/v1\/snapshots\/([^/]+)(?:\/(info|pack|push|compact))?$/;
const MAKES_SNAPSHOT = new Set([
  "/v1/snapshots",
  "/v1/snapshots/build",
  "/v1/snapshots/unpack",
  "/v1/snapshots/pull",
]);
const ANY_NODE = /^\/v1\/(tokens(\/[^/]+)?|version|openapi\.json)$/;
const TERMINAL = /^\/v1\/sandboxes\/[^/]+\/terminal$/;

const isPublic = (method: string, path: string): boolean =>
  (method === "GET" && (path === "/v1/health" || path === "/v1/openapi.json")) ||
  path === "/v1/console/session";

const notFound = (method: string, path: string) => new ForkdError("not_found", `no route ${method} ${path}`);
const adminOnly = (what: string) => new ForkdError("forbidden", `${what} is for admin callers only`);

/** Aborted when the client goes before its reply ended. */
function clientSignal(res: ServerResponse): AbortSignal {
  const ac = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) ac.abort();
  });
  return ac.signal;
}

export function restHandler(g: Gateway): RequestListener {
  return (req, res) => {
    serve(g, req, res).catch((e: unknown) => {
      if (!(e instanceof ForkdError))
        g.log.warn("gateway: a request failed", { error: errorMessage(e), url: req.url });
      req.resume();
      if (res.headersSent) return void res.destroy();
      const { status, body } = envelope(e);
      const headers: Record<string, string> = {};
      if (e instanceof ForkdError && e.code === "unauthenticated")
        headers["www-authenticate"] = 'Bearer realm="forkd"';
      const wait = e instanceof ForkdError ? e.details.retry_after_s : undefined;
      if (typeof wait === "number") headers["retry-after"] = String(wait);
      sendJson(res, status, body, headers);
    });
  };
}

async function serve(g: Gateway, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const method = req.method ?? "GET";
  const url = new URL(req.url ?? "/", "http://gateway");
  const path = url.pathname;
  if ((method === "GET" || method === "HEAD") && isConsoleAsset(path))
    return serveConsoleAsset(g, req, res, path);
  const pub = isPublic(method, path);
  const who = await restCaller(g, req, url, { needs: !pub, upgrade: false });
  if (!pub && who.caller === ANONYMOUS)
    throw new ForkdError("unauthenticated", "missing or wrong bearer token");
  const signal = clientSignal(res);

  if (path.startsWith("/v1/console/")) return consoleRoute(g, req, res, path, who);
  const sb = SANDBOX.exec(path);
  if (sb) return sandboxCall(g, req, res, who, decodeURIComponent(sb[1] ?? ""), sb[2] ?? "");
  if (path === "/v1/sandboxes") {
    if (method === "GET") return done(req, res, 200, await listSandboxes(g, who, url, signal));
    if (method === "POST") return forkRoute(g, req, res, who, signal);
  }
  if (method === "GET" && path === "/v1/health") return done(req, res, 200, health(g, who));
  if (method === "GET" && path === "/v1/nodes") {
    if (!isAdmin(who.caller)) throw adminOnly("GET /v1/nodes");
    return done(req, res, 200, nodesView(g.view));
  }
  if (method === "GET" && path === "/metrics") {
    if (!isAdmin(who.caller)) throw adminOnly("GET /metrics");
    const m = await g.metrics.render();
    req.resume();
    res.writeHead(200, { "content-type": m.contentType });
    return void res.end(m.text);
  }
  if (method === "GET" && path === "/v1/events") {
    req.resume();
    return serveEvents(g, who, res);
  }
  if (method === "GET" && path === "/v1/audit") {
    const a = await mergedAudit(g, who, url, signal);
    if ("reply" in a) return done(req, res, a.reply.status, JSON.parse(a.reply.body.toString("utf8")));
    return done(req, res, 200, a);
  }
  if (method === "GET" && path === "/v1/snapshots")
    return done(req, res, 200, await listSnapshots(g, who, signal));
  if (method === "POST" && MAKES_SNAPSHOT.has(path))
    return relay(g, req, res, await snapshotNode(g, who, req, null), {
      door: "rest",
      kind: "snapshot",
      authorization: who.authorization,
    });
  const snap = SNAPSHOT.exec(path);
  if (snap && !MAKES_SNAPSHOT.has(path)) {
    const tag = decodeURIComponent(snap[1] ?? "");
    const sub = snap[2];
    if (method === "GET" && sub === undefined) {
      const r = await getSnapshot(g, who, tag, signal);
      if ("view" in r) return done(req, res, 200, r.view);
      return done(req, res, r.reply.status, JSON.parse(r.reply.body.toString("utf8")));
    }
    const routed =
      (method === "DELETE" && sub === undefined) ||
      (method === "GET" && (sub === "info" || sub === "pack")) ||
      (method === "POST" && (sub === "push" || sub === "compact"));
    if (routed)
      return relay(g, req, res, await snapshotNode(g, who, req, tag), {
        door: "rest",
        kind: "snapshot",
        authorization: who.authorization,
      });
  }
  if (ANY_NODE.test(path)) {
    const id = mostRoom(g.view.candidates(null, (n) => g.assignments.of(n))) ?? g.view.nodes()[0]?.id;
    const node = id === undefined ? undefined : g.view.node(id);
    if (!node) throw new ForkdError("unavailable", "no node of the cluster answers now");
    return relay(g, req, res, node, { door: "rest", kind: "node", authorization: who.authorization });
  }
  req.resume();
  throw notFound(method, path);
}

function done(req: IncomingMessage, res: ServerResponse, status: number, body: unknown): void {
  req.resume();
  sendJson(res, status, body);
}

function health(g: Gateway, who: Authenticated): Record<string, unknown> {
  const nodes = g.view.nodes();
  const accels = new Map<string, number>();
  for (const n of nodes) accels.set(n.machine.accel, (accels.get(n.machine.accel) ?? 0) + 1);
  const sandboxes = g.view
    .sandboxes()
    .filter((r) => (r.state === "running" || r.state === "paused") && mayHold(who.caller, r.owner)).length;
  return {
    ok: g.view.live && nodes.length > 0,
    accel: (accels.get("kvm") ?? 0) > 0 ? "kvm" : "tcg",
    accel_reason: `a cluster gateway over ${nodes.length} node(s): ${[...accels].map(([a, n]) => `${n} ${a}`).join(", ") || "none"}`,
    sandboxes,
    pool: {},
    cluster: { nodes: nodes.length, etcd: g.view.live },
  };
}

async function forkRoute(
  g: Gateway,
  req: IncomingMessage,
  res: ServerResponse,
  who: Authenticated,
  signal: AbortSignal,
): Promise<void> {
  const body = jsonObject(await readBody(req, g.bounds.bodyBytes));
  const tag = body.snapshot_tag;
  if (typeof tag !== "string")
    throw new ForkdError("invalid_argument", "snapshot_tag: a tag is required", { field: "snapshot_tag" });
  const n = childrenOf(body);
  const a = await forkAcross(
    g,
    who,
    tag,
    n,
    {
      door: "rest",
      path: "/v1/sandboxes",
      body: (count) => Buffer.from(JSON.stringify({ ...body, n: count })),
      headers: who.authorization ? { authorization: who.authorization } : {},
    },
    signal,
  );
  sendJson(res, a.status, a.body);
}

/** A call to one sandbox: to its node, or answered from its record (lost, node gone). */
async function sandboxCall(
  g: Gateway,
  req: IncomingMessage,
  res: ServerResponse,
  who: Authenticated,
  id: string,
  rest: string,
): Promise<void> {
  if (!SANDBOX_ID_RE.test(id)) {
    req.resume();
    throw noSandbox(id);
  }
  const route = routeSandbox(await g.view.sandbox(id), who.caller, (n) => g.view.node(n));
  const exact = rest === "" || rest === "/";
  const names = tagNames(who.caller);
  switch (route.kind) {
    case "none":
      req.resume();
      throw noSandbox(id);
    case "node":
      return relay(g, req, res, route.node, {
        door: "rest",
        kind: "sandbox",
        authorization: who.authorization,
      });
    case "lost": {
      const r = route.record;
      if (exact && req.method === "GET") return done(req, res, 200, recordView(r, names));
      if (exact && req.method === "DELETE") {
        await forgetLost(g.kv, g.keys, id);
        return done(req, res, 200, { deleted: id });
      }
      req.resume();
      throw new ForkdError(
        "unavailable",
        `sandbox ${id} is lost: ${r.reason ?? "its node left the cluster"}`,
        {
          id,
          node: r.node,
          state: "lost",
          reason: r.reason,
        },
      );
    }
    case "absent": {
      const r = route.record;
      if (exact && req.method === "GET" && r.state === "exited")
        return done(req, res, 200, recordView(r, names));
      req.resume();
      throw new ForkdError(
        "unavailable",
        `sandbox ${id}'s node ${r.node} is not in the cluster (it stopped answering; its sandboxes are being marked lost)`,
        { id, node: r.node },
      );
    }
  }
}

/** The REST listener's `upgrade` handler: only a sandbox's terminal, relayed to its node. */
export function restUpgrade(g: Gateway): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  return (req, socket, head) => {
    socket.on("error", () => socket.destroy());
    upgrade(g, req, socket, head).catch((e: unknown) => {
      const { status, body } = envelope(e);
      rawReply(socket, status, body);
    });
  };
}

async function upgrade(g: Gateway, req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
  const url = new URL(req.url ?? "/", "http://gateway");
  if (req.method !== "GET" || !TERMINAL.test(url.pathname))
    throw new ForkdError("invalid_argument", "only a sandbox's terminal takes a WebSocket upgrade");
  const who = await restCaller(g, req, url, { needs: true, upgrade: true });
  if (who.caller === ANONYMOUS) throw new ForkdError("unauthenticated", "missing or wrong bearer token");
  const id = decodeURIComponent(SANDBOX.exec(url.pathname)?.[1] ?? "");
  const route = SANDBOX_ID_RE.test(id)
    ? routeSandbox(await g.view.sandbox(id), who.caller, (n) => g.view.node(n))
    : ({ kind: "none" } as const);
  if (route.kind === "none") throw noSandbox(id);
  if (route.kind !== "node")
    throw new ForkdError(
      "unavailable",
      `sandbox ${id} has no node in the cluster (${route.record.state === "lost" ? "lost" : "its node left"})`,
    );
  relayUpgrade(g, req, socket, head, route.node, {
    door: "rest",
    kind: "terminal",
    authorization: who.authorization,
  });
}
