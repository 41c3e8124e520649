/**
 * /contexts of E2B's code interpreter over forkd's kernels: create ({language, cwd} → {id,
 * language, cwd}), list (every kernel's contexts, the default ones included), delete and restart
 * (`/contexts/:id`, `/contexts/:id/restart`, 204). Ids are context-ids.ts's.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { z } from "zod";
import type { AgentClient, CodeContext } from "../../agent/index.js";
import { EVAL_LANGUAGES } from "../../agent/index.js";
import type { E2bServices } from "../context.js";
import { ForkdError } from "../../util/index.js";
import { readJsonBody } from "./body.js";
import { e2bContext, parseE2bContextId, runnerOf } from "./context-ids.js";
import { NdjsonReply } from "./ndjson-reply.js";
import type { SandboxAccess } from "../plane-target.js";
import { sendError } from "./send-error.js";

const CreateBody = z.object({
  language: z.string().max(40).nullish(),
  cwd: z.string().min(1).max(4096).nullish(),
});

/** Handles a /contexts request; false when the path is not one of these routes. */
export function contextsRoute(
  s: E2bServices,
  req: IncomingMessage,
  res: ServerResponse,
  sb: SandboxAccess,
  path: string,
): boolean {
  const m = /^\/contexts(?:\/([^/]+)(\/restart)?)?\/?$/.exec(path);
  if (!m) return false;
  const [, rawId, restart] = m;
  const id = rawId === undefined ? undefined : decodeURIComponent(rawId);
  const method = req.method ?? "GET";
  const run = async (): Promise<void> => {
    if (id === undefined && method === "POST") {
      const body = await readJsonBody(req, CreateBody, 64 * 1024);
      const language = runnerOf(body.language);
      if (language === "bash") {
        throw new ForkdError("invalid_argument", "bash cells run as commands: they have no contexts");
      }
      const [c] = await use(s, sb, (a) =>
        a.contexts(language, { op: "create", ...(body.cwd ? { cwd: body.cwd } : {}) }),
      );
      return json(res, 200, e2bContext(c!));
    }
    if (id === undefined && method === "GET") {
      const all: CodeContext[] = [];
      for (const language of EVAL_LANGUAGES) {
        try {
          all.push(...(await use(s, sb, (a) => a.contexts(language, { op: "list" }))));
        } catch (e) {
          // a kernel the image has not got has no contexts
          if (!(e instanceof ForkdError && e.code === "unavailable" && language !== "python")) throw e;
        }
      }
      return json(res, 200, all.map(e2bContext));
    }
    if (id !== undefined && ((method === "DELETE" && !restart) || (method === "POST" && restart))) {
      const { language, kernelId } = parseE2bContextId(id);
      const op = restart ? "restart" : "delete";
      await use(s, sb, (a) => a.contexts(language, { op, context: kernelId }));
      res.writeHead(204).end();
      return;
    }
    throw new ForkdError("not_found", `no route ${method} ${path}`);
  };
  run().catch((e: unknown) => sendError(new NdjsonReply(req, res), e));
  return true;
}

function use<T>(s: E2bServices, sb: SandboxAccess, fn: (a: AgentClient) => Promise<T>): Promise<T> {
  return s.sandboxes.use(sb.sandbox.record.id, (agent) => fn(agent));
}

function json(res: ServerResponse, status: number, v: unknown): void {
  if (res.destroyed) return;
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(v));
}
