/**
 * GET /v1/sandboxes/:id/files/watch: a directory's changes as NDJSON lines (schema WatchLine),
 * paced by the client (the guest queues a bounded number while it reads slowly, then reports
 * `overflow`). A path the guest cannot watch is an error reply with its status; a client that
 * hangs up at any byte cancels the watch in the guest and releases the sandbox.
 */
import { Hono } from "hono";
import type { z } from "zod";
import type { WatchEvent, WatchHandle } from "../../agent/index.js";
import type { Services } from "../../app/index.js";
import type { ApiEnv } from "../env.js";
import { WatchQuery, truthy } from "../contract/schemas.js";
import type { WatchLine } from "../contract/schemas.js";
import { parseQuery } from "../parse.js";
import { toEnvelope } from "../errors.js";
import { replyStream } from "../../http/index.js";
import type { ReplySink } from "../../http/index.js";

type WatchLineView = z.infer<typeof WatchLine>;

const lineOf = (e: WatchEvent): WatchLineView => ({ type: e.type, path: e.path, is_dir: e.isDir ?? false });

export function watchRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.get("/:id/files/watch", async (c) => {
    const q = parseQuery(c, WatchQuery);
    const lease = s.sandboxes.lease(c.req.param("id"));
    // Events that come before the reply's body exists wait (held, so paced) until it does.
    let sink: ReplySink | null = null;
    let attach!: () => void;
    const attached = new Promise<void>((r) => (attach = r));
    const send = (e: WatchEvent): unknown => {
      if (!sink) return attached.then(() => send(e));
      return sink.line(lineOf(e)) || sink.drained();
    };
    let handle: WatchHandle;
    try {
      handle = lease.agent.watch(q.path, { recursive: truthy(q.recursive) }, send);
      await handle.ready;
    } catch (e) {
      lease.release();
      throw await lease.explain(e); // before the reply started: an error reply with its status
    }
    const stream = replyStream(
      (out) => {
        sink = out;
        const stop = () => {
          handle.stop();
          lease.release();
        };
        // The client hung up (also before the body started): the guest's watch is cancelled.
        out.onHangup(stop);
        if (out.gone) return;
        out.line({ type: "ready" } satisfies WatchLineView);
        attach();
        handle.done
          .then(
            () => out.line({ type: "end" } satisfies WatchLineView),
            async (e: unknown) => {
              const { body } = toEnvelope(await lease.explain(e));
              s.metrics.failure("watchDir", body.error.code);
              out.line({ type: "error", ...body } satisfies WatchLineView);
            },
          )
          .finally(() => {
            stop();
            out.end();
          })
          .catch((e: unknown) => s.log.warn("watch: reply not sent", { error: String(e) }));
      },
      { outgoing: c.env?.outgoing },
    );
    return new Response(stream, { status: 200, headers: { "content-type": "application/x-ndjson" } });
  });

  return app;
}
