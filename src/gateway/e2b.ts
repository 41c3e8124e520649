/**
 * E2B's API on a gateway (FORKD_GATEWAY_E2B_LISTEN), so E2B's SDKs work unchanged against a
 * cluster. Its sandbox plane (a request routed by E2B's `E2b-Sandbox-Id`/`E2b-Sandbox-Port`
 * headers or a `<port>-<id>.<domain>` Host: src/http/sandbox-route.ts) goes to the E2B
 * listener of the sandbox's node as it came (the node authorizes it: the sandbox's envd access
 * token or an API key, both passed on), WebSocket upgrades too; a sandbox no node serves
 * answers 502, as E2B's proxy answers for a sandbox that is gone, the same whatever the reason
 * (no credential is checked before it: it tells nothing of which ids exist). Its control plane is
 * authenticated here (an API key): a create is placed and sent to one node (./fork.ts, one
 * child), listings are merged (./e2b-list.ts), a sandbox's calls go to its node, a template's
 * delete to a holder. Errors are E2B's {code, message}.
 */
import type { IncomingMessage, RequestListener, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { mayHold } from "../app/index.js";
import { forgetLost } from "../cluster/index.js";
import type { NodeRecord } from "../cluster/index.js";
import { sandboxTarget, sendJson } from "../http/index.js";
import type { SandboxTarget } from "../http/index.js";
import { ForkdError, SANDBOX_ID_RE, errorMessage, statusOf } from "../util/index.js";
import { e2bCaller } from "./auth.js";
import { entryFor, holdersOf } from "./catalog.js";
import type { Gateway } from "./context.js";
import { e2bList } from "./e2b-list.js";
import { forkAcross } from "./fork.js";
import { relay, relayUpgrade } from "./relay.js";
import { jsonObject, rawReply, readBody, sendE2bError } from "./reply.js";

const SANDBOX = /^\/(?:v2\/)?sandboxes\/([^/]+)(\/.*)?$/;
const LISTS = new Set(["/sandboxes", "/v2/sandboxes", "/snapshots"]);
const TEMPLATE = /^\/templates\/([^/]+)$/;

/** E2B's answer for a sandbox-plane request no node serves. */
/**
 * The same answer whatever the reason (no record, lost, its node gone): the plane is reached
 * before any credential is checked, so it tells nothing of which ids exist.
 */
const planeGone = (t: SandboxTarget) => ({
  code: 502,
  message: `The sandbox ${t.sandboxId} was not found (or is not running)`,
  sandboxId: t.sandboxId,
});

export function e2bHandler(g: Gateway): RequestListener {
  return (req, res) => {
    const t = sandboxTarget(req);
    (t ? plane(g, req, res, t) : control(g, req, res)).catch((e: unknown) => {
      if (!(e instanceof ForkdError))
        g.log.warn("gateway: an E2B request failed", { error: errorMessage(e) });
      req.resume();
      sendE2bError(res, e);
    });
  };
}

/** The node whose E2B listener serves sandbox-plane target `t` (null: none does). */
async function planeNode(g: Gateway, t: SandboxTarget): Promise<NodeRecord | null> {
  const r = await g.view.sandbox(t.sandboxId);
  if (!r || r.state === "exited" || r.state === "lost") return null;
  const node = g.view.node(r.node);
  return node && node.e2b !== null ? node : null;
}

async function plane(g: Gateway, req: IncomingMessage, res: ServerResponse, t: SandboxTarget): Promise<void> {
  const node = await planeNode(g, t);
  if (!node) {
    req.resume();
    return sendJson(res, 502, planeGone(t));
  }
  relay(g, req, res, node, { door: "e2b", kind: "e2b-plane" });
}

async function control(g: Gateway, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? "/", "http://gateway");
  const path = url.pathname;
  const method = req.method ?? "GET";
  if (method === "GET" && path === "/health") {
    req.resume();
    res.writeHead(204);
    return void res.end();
  }
  const who = await e2bCaller(g, req);
  const ac = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) ac.abort();
  });
  if (method === "POST" && (path === "/sandboxes" || path === "/v2/sandboxes")) {
    const raw = await readBody(req, g.bounds.bodyBytes);
    const body = jsonObject(raw);
    const tag = typeof body.templateID === "string" ? body.templateID.replace(/:default$/, "") : null;
    if (tag === null) throw new ForkdError("invalid_argument", "templateID: a template is required");
    const a = await forkAcross(
      g,
      who,
      tag,
      1,
      { door: "e2b", path, body: () => raw, headers: { authorization: who.authorization ?? "" } },
      ac.signal,
    ).catch((e: unknown) => {
      // A template the caller cannot see is E2B's "template not found".
      if (e instanceof ForkdError && e.code === "not_found")
        throw new ForkdError("not_found", `template ${tag} not found`, { tag });
      throw e;
    });
    if (a.reply) {
      const type = a.reply.headers["content-type"];
      res.writeHead(a.reply.status, {
        "content-type": typeof type === "string" ? type : "application/json",
        "content-length": String(a.reply.body.length),
      });
      return void res.end(a.reply.body);
    }
    const f = (a.body as { failures?: { code: string; message: string }[] }).failures?.[0];
    const status = f ? statusOf(f.code as ForkdError["code"]) || 500 : 500;
    return sendJson(res, status, { code: status, message: f?.message ?? "the sandbox did not start" });
  }
  if (method === "GET" && LISTS.has(path)) {
    req.resume();
    const r = await e2bList(g, who, url, ac.signal);
    return sendJson(res, r.status, r.body, r.headers);
  }
  const sb = SANDBOX.exec(path);
  if (sb) {
    const id = decodeURIComponent(sb[1] ?? "");
    const r = SANDBOX_ID_RE.test(id) ? await g.view.sandbox(id) : null;
    if (!r || !mayHold(who.caller, r.owner) || r.state === "exited") {
      req.resume();
      throw new ForkdError("not_found", `sandbox ${id} not found`);
    }
    if (r.state === "lost") {
      req.resume();
      if (method === "DELETE" && (sb[2] ?? "") === "") {
        await forgetLost(g.kv, g.keys, id);
        res.writeHead(204);
        return void res.end();
      }
      throw new ForkdError(
        "not_found",
        `sandbox ${id} not found: it is lost (${r.reason ?? "its node left"})`,
      );
    }
    const node = g.view.node(r.node);
    if (!node) {
      req.resume();
      throw new ForkdError("unavailable", `sandbox ${id}'s node ${r.node} left the cluster`);
    }
    return relay(g, req, res, node, { door: "e2b", kind: "e2b-sandbox" });
  }
  const tpl = TEMPLATE.exec(path);
  if (tpl && method === "DELETE") {
    const tag = decodeURIComponent(tpl[1] ?? "").replace(/:default$/, "");
    const e = await entryFor(g, who.caller, tag).catch(() => {
      throw new ForkdError("not_found", `template ${tag} not found`);
    });
    const node = holdersOf(g, e).find((n) => n.e2b !== null);
    if (!node) throw new ForkdError("unavailable", `no node of the cluster holds ${tag} now`);
    return relay(g, req, res, node, { door: "e2b", kind: "e2b-template" });
  }
  req.resume();
  throw new ForkdError("not_found", `no route ${method} ${path}`);
}

/** The E2B listener's `upgrade` handler: a guest port's WebSocket, to the sandbox's node. */
export function e2bUpgrade(g: Gateway): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  return (req, socket, head) => {
    socket.on("error", () => socket.destroy());
    const t = sandboxTarget(req);
    if (!t)
      return rawReply(socket, 404, { code: 404, message: "only a sandbox's own ports take an upgrade" });
    planeNode(g, t).then(
      (node) =>
        node
          ? relayUpgrade(g, req, socket, head, node, { door: "e2b", kind: "e2b-plane" })
          : rawReply(socket, 502, planeGone(t)),
      (e: unknown) => rawReply(socket, 503, { code: 503, message: errorMessage(e) }),
    );
  };
}
