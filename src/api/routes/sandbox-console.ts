/**
 * GET /v1/sandboxes/{id}/console?tail_bytes=N: the tail of the sandbox VM's serial console log
 * (default 64 KiB, at most 1 MiB), as text. A sandbox whose files are gone (exited) has none.
 */
import { Hono } from "hono";
import { readFileTail } from "../../util/index.js";
import { ForkdError } from "../../util/index.js";
import { vmFiles } from "../../vmm/index.js";
import { CONSOLE_TAIL_DEFAULT, ConsoleTailQuery } from "../contract/schemas.js";
import type { ApiEnv } from "../env.js";
import { parseQuery } from "../parse.js";
import type { Services } from "../../app/index.js";

export function sandboxConsoleRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();
  app.get("/:id/console", async (c) => {
    const id = c.req.param("id");
    const q = parseQuery(c, ConsoleTailQuery);
    const sb = s.sandboxes.get(id);
    const tail = await readFileTail(
      vmFiles(sb.dir).console,
      q.tail_bytes === undefined ? CONSOLE_TAIL_DEFAULT : Number(q.tail_bytes),
    );
    if (!tail)
      throw new ForkdError("not_found", `sandbox ${id} has no console log (its files are gone)`, { id });
    return c.body(tail.bytes.toString("utf8"), 200, {
      "content-type": "text/plain; charset=utf-8",
      "cache-control": "no-store",
    });
  });
  return app;
}
