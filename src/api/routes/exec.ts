/** exec (buffered and NDJSON-streaming) and eval in a sandbox's warm interpreter. */
import { Hono } from "hono";
import type { z } from "zod";
import type { ExecRequest } from "../../agent/client.js";
import type { Services } from "../services.js";
import { Eval, Exec } from "../schemas.js";
import { parseBody } from "../parse.js";
import { toEnvelope } from "../errors.js";

/** Buffered exec keeps at most this much of each output stream. */
const MAX_BUFFERED = 16 << 20;

function toRequest(b: z.infer<typeof Exec>): ExecRequest {
  return {
    ...(typeof b.cmd === "string" ? { shell: b.cmd } : { argv: b.cmd }),
    env: b.env,
    cwd: b.cwd,
    timeoutMs: b.timeout_ms,
    stdin: b.stdin !== undefined,
  };
}

class Capped {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  push(b: Buffer): void {
    if (this.size >= MAX_BUFFERED) {
      this.truncated = true;
      return;
    }
    const part = b.subarray(0, MAX_BUFFERED - this.size);
    if (part.length < b.length) this.truncated = true;
    this.chunks.push(Buffer.from(part));
    this.size += part.length;
  }
  text(): string {
    return Buffer.concat(this.chunks).toString("utf8");
  }
}

export function execRoutes(s: Services): Hono {
  const app = new Hono();

  app.post("/:id/exec", async (c) => {
    const body = await parseBody(c, Exec);
    const agent = s.sandboxes.agent(c.req.param("id"));
    const out = new Capped();
    const err = new Capped();
    const t0 = performance.now();
    const h = agent.exec(toRequest(body), { onStdout: (d) => out.push(d), onStderr: (d) => err.push(d) });
    if (body.stdin !== undefined) {
      h.writeStdin(Buffer.from(body.stdin, "utf8"));
      h.closeStdin();
    }
    const r = await h.result;
    return c.json({
      exit_code: r.exitCode,
      signal: r.signal,
      timed_out: r.timedOut,
      stdout: out.text(),
      stderr: err.text(),
      stdout_truncated: out.truncated,
      stderr_truncated: err.truncated,
      duration_ms: Math.round(performance.now() - t0),
    });
  });

  // One JSON object per line: started, stdout/stderr (base64: output is bytes), exit or error.
  app.post("/:id/exec/stream", async (c) => {
    const body = await parseBody(c, Exec);
    const agent = s.sandboxes.agent(c.req.param("id"));
    const enc = new TextEncoder();
    let handle: ReturnType<typeof agent.exec> | null = null;
    let finished = false;
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        const send = (o: unknown) => {
          if (!finished) controller.enqueue(enc.encode(JSON.stringify(o) + "\n"));
        };
        const t0 = performance.now();
        handle = agent.exec(toRequest(body), {
          onStdout: (d) => send({ type: "stdout", data: d.toString("base64") }),
          onStderr: (d) => send({ type: "stderr", data: d.toString("base64") }),
        });
        handle.started.then(
          (p) => send({ type: "started", pid: p.pid }),
          () => undefined,
        );
        if (body.stdin !== undefined) {
          handle.writeStdin(Buffer.from(body.stdin, "utf8"));
          handle.closeStdin();
        }
        handle.result.then(
          (r) => {
            send({
              type: "exit",
              exit_code: r.exitCode,
              signal: r.signal,
              timed_out: r.timedOut,
              duration_ms: Math.round(performance.now() - t0),
            });
            finished = true;
            controller.close();
          },
          (e: unknown) => {
            const { body: env } = toEnvelope(e);
            send({ type: "error", ...env });
            finished = true;
            controller.close();
          },
        );
      },
      cancel() {
        // The client went away: do not leave its command running.
        if (!finished) handle?.signal(9);
        finished = true;
      },
    });
    return new Response(stream, { status: 200, headers: { "content-type": "application/x-ndjson" } });
  });

  app.post("/:id/eval", async (c) => {
    const body = await parseBody(c, Eval);
    const agent = s.sandboxes.agent(c.req.param("id"));
    return c.json(await agent.eval(body.code, body.timeout_ms));
  });

  return app;
}
