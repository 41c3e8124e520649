/**
 * POST /execute of E2B's code interpreter: a cell run by forkd's warm kernel of its language (or
 * bash, as a command), answered with E2B's NDJSON stream (messages.ts) while it runs: its stdout
 * and stderr as they come, then its results, its error, its execution count, end_of_execution.
 *
 * The reply is committed (200 and its headers) as soon as the request is accepted, before the
 * cell's first output, as E2B's server does: the SDK's `timeoutMs` counts from the headers, so
 * a cell that prints nothing would otherwise never time out. A failure before that is a plain
 * HTTP error (404 for an unknown context, 400 for a language forkd has no kernel for); after
 * it, an error line and end_of_execution. A sandbox that ends under its cell (killed, or paused)
 * cuts the connection, as E2B's does when its VM goes: the SDK then finds the sandbox not
 * running and says it was killed. A client that
 * hangs up mid-stream interrupts its cell (SIGINT, as at a timeout: the kernel keeps its state,
 * and a cell still waiting behind another is dropped): nobody can read its results any more, and
 * a runaway cell an SDK gave up on (its `timeoutMs`) would otherwise hold the kernel and queue
 * every later cell behind it until the server's own timeout.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { z } from "zod";
import { CellEnv } from "../../app/index.js";
import type { E2bServices } from "../context.js";
import { ForkdError, errorMessage } from "../../util/index.js";
import type { EvalLanguage } from "../../agent/index.js";
import type { Lease } from "../../sandbox/index.js";
import { readJsonBody } from "./body.js";
import { parseE2bContextId, runnerOf } from "./context-ids.js";
import { cellEndLines, errorLine, outputLine } from "./messages.js";
import { NdjsonReply } from "./ndjson-reply.js";
import type { SandboxAccess } from "../plane-target.js";
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
  s: E2bServices,
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
    if (ctx && !(await contextExists(lease, ctx)))
      throw new ForkdError("not_found", `Context ${String(body.context_id)} not found`);
    reply.start();
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
    if (reply.started && !running(s, sb.sandbox.record.id)) {
      reply.cut();
      return;
    }
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

/** How long a context's check may hold the reply: a kernel busy with a cell answers it only after that. */
const CONTEXT_CHECK_MS = 2_000;

/**
 * Whether the kernel has context `ctx` (E2B's server knows its contexts before it streams). A
 * kernel that does not say within CONTEXT_CHECK_MS (busy) is taken at its word later: the
 * cell's own error line then says the context is unknown.
 */
async function contextExists(
  lease: Lease,
  ctx: { language: EvalLanguage; kernelId: string },
): Promise<boolean> {
  if (ctx.kernelId === "default") return true;
  const listed = lease.agent
    .contexts(ctx.language, { op: "list" })
    .then((cs) => cs.some((c) => c.id === ctx.kernelId));
  let timer: NodeJS.Timeout | undefined;
  const busy = new Promise<boolean>((r) => (timer = setTimeout(() => r(true), CONTEXT_CHECK_MS)));
  try {
    return await Promise.race([listed, busy]);
  } finally {
    clearTimeout(timer);
    listed.catch(() => undefined);
  }
}

/** Whether sandbox `id` still runs (a cell cut because it does not is a cut connection). */
function running(s: E2bServices, id: string): boolean {
  try {
    return s.sandboxes.get(id).state === "running";
  } catch {
    return false;
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
