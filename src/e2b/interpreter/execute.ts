/**
 * POST /execute of E2B's code interpreter: a cell run by forkd's warm kernel of its language (or
 * bash, as a command), answered with E2B's NDJSON stream (messages.ts) while it runs: its stdout
 * and stderr as they come, then its results, its error, its execution count, end_of_execution.
 *
 * A failure before the first line is a plain HTTP error (404 for an unknown context, 400 for a
 * language forkd has no kernel for); after it, an error line and end_of_execution. A client that
 * hangs up mid-stream interrupts its cell (SIGINT, as at a timeout: the kernel keeps its state,
 * and a cell still waiting behind another is dropped): nobody can read its results any more, and
 * a runaway cell an SDK gave up on (its `timeoutMs`) would otherwise hold the kernel and queue
 * every later cell behind it until the server's own timeout.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { z } from "zod";
import { CellEnv } from "../../api/contract/schemas.js";
import type { Services } from "../../api/services.js";
import { ForkdError, errorMessage } from "../../util/errors.js";
import type { Lease } from "../../sandbox/lease.js";
import { readJsonBody } from "./body.js";
import { parseE2bContextId, runnerOf } from "./context-ids.js";
import { cellEndLines, errorLine, outputLine } from "./messages.js";
import { NdjsonReply } from "./ndjson-reply.js";
import type { SandboxAccess } from "./port-handler.js";
import { sendError } from "./send-error.js";

/** The largest cell accepted (as forkd's own eval: its body bound for code). */
const BODY_MAX = 20 << 20;
/** E2B's server sets no timeout of its own; forkd's longest eval timeout bounds a cell. */
export const CELL_TIMEOUT_MS = 3600 * 1000;

export const ExecuteBody = z.object({
  code: z.string(),
  context_id: z.string().max(200).nullish(),
  language: z.string().max(40).nullish(),
  env_vars: CellEnv.nullish(),
});

export async function execute(
  s: Services,
  req: IncomingMessage,
  res: ServerResponse,
  sb: SandboxAccess,
): Promise<void> {
  let lease: Lease | null = null;
  const reply = new NdjsonReply(req, res);
  try {
    const body = await readJsonBody(req, ExecuteBody, BODY_MAX);
    const ctx = body.context_id ? parseE2bContextId(body.context_id) : null;
    const runner = ctx ? ctx.language : runnerOf(body.language);
    const env = body.env_vars ?? undefined; // over the sandbox's own (AgentClient.defaultEnv)
    lease = s.sandboxes.lease(sb.sandbox.record.id);
    if (runner === "bash") await runBash(lease, body.code, env, reply);
    else {
      const r = await lease.agent.eval(body.code, CELL_TIMEOUT_MS, runner, {
        ...(ctx ? { context: ctx.kernelId } : {}),
        ...(env ? { env } : {}),
        onOutput: (stream, text) => void reply.line(outputLine(stream, text)),
        signal: reply.signal,
      });
      for (const line of cellEndLines(r)) reply.line(line);
    }
    reply.end();
  } catch (e) {
    const err = lease ? await lease.explain(e) : e;
    if (reply.started || (err instanceof ForkdError && err.code === "timeout")) {
      const name = err instanceof ForkdError && err.code === "timeout" ? "TimeoutError" : "ExecutionError";
      reply.line(errorLine(name, errorMessage(err), ""));
      reply.line({ type: "end_of_execution" });
      reply.end();
    } else {
      sendError(reply, err);
    }
  } finally {
    lease?.release();
  }
}

/** A bash cell: `bash -c CODE` as the image's default user, its output streamed, paced. */
async function runBash(
  lease: Lease,
  code: string,
  env: Record<string, string> | undefined,
  reply: NdjsonReply,
): Promise<void> {
  const send = (stream: "stdout" | "stderr", d: Buffer) =>
    reply.line(outputLine(stream, d.toString("utf8"))) || reply.drained();
  const h = lease.agent.exec(
    { argv: ["bash", "-c", code], ...(env ? { env } : {}), timeoutMs: CELL_TIMEOUT_MS },
    { onStdout: (d) => send("stdout", d), onStderr: (d) => send("stderr", d) },
  );
  const onGone = () => h.signal(9);
  reply.signal.addEventListener("abort", onGone, { once: true });
  try {
    const r = await h.result;
    if (r.timedOut) reply.line(errorLine("TimeoutError", "the command timed out", ""));
    else if (r.exitCode !== 0) {
      const how = r.exitCode === null ? `killed by signal ${r.signal ?? "?"}` : `exit status ${r.exitCode}`;
      reply.line(errorLine("CommandExitError", how, ""));
    }
    reply.line({ type: "end_of_execution" });
  } finally {
    reply.signal.removeEventListener("abort", onGone);
  }
}
