import { Hono } from "hono";
import { ForkdError } from "../../util/errors.js";
import { assertTag } from "../../util/ids.js";
import { createSnapshot } from "../../snapshot/create.js";
import type { Services } from "../services.js";
import { CreateSnapshot } from "../contract/schemas.js";
import { parseBody } from "../parse.js";
import { toEnvelope } from "../errors.js";

export function snapshotRoutes(s: Services): Hono {
  const app = new Hono();

  app.get("/", async (c) =>
    c.json({ snapshots: await s.store.list(), pending: await s.store.listPending() }),
  );

  // ?stream=1: NDJSON progress lines ({"type":"progress","message"}), then {"type":"done",
  // "snapshot"} or {"type":"error","error"}; otherwise one JSON reply when ready.
  app.post("/", async (c) => {
    const body = await parseBody(c, CreateSnapshot);
    const req = {
      tag: body.tag,
      template: body.template,
      warm: body.warm ?? null,
      warmEval: body.warm_eval ?? null,
      memoryMiB: body.memory_mib,
      vcpus: body.vcpus,
    };
    const logLine = (line: string) => s.log.info(`snapshot ${body.tag}: ${line}`);
    if (c.req.query("stream") !== "1") {
      const meta = await createSnapshot(s.snapshotDeps, req, logLine);
      s.sandboxes.prewarm(meta.tag);
      return c.json(meta, 201);
    }
    // Refuse a taken tag with a status code, before the stream starts.
    if (await s.store.has(body.tag)) {
      throw new ForkdError("conflict", `snapshot ${body.tag} already exists`, { tag: body.tag });
    }
    const enc = new TextEncoder();
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        const send = (o: unknown) => controller.enqueue(enc.encode(JSON.stringify(o) + "\n"));
        createSnapshot(s.snapshotDeps, req, (line) => {
          logLine(line);
          send({ type: "progress", message: line });
        }).then(
          (meta) => {
            s.sandboxes.prewarm(meta.tag);
            send({ type: "done", snapshot: meta });
            controller.close();
          },
          (e: unknown) => {
            send({ type: "error", ...toEnvelope(e).body });
            controller.close();
          },
        );
      },
    });
    return new Response(stream, { status: 201, headers: { "content-type": "application/x-ndjson" } });
  });

  app.get("/:tag", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    if (!(await s.store.has(tag))) {
      const p = await s.store.pending(tag);
      if (p) return c.json(p);
    }
    return c.json((await s.store.get(tag)).meta);
  });

  app.delete("/:tag", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    const users = s.sandboxes.countByTag(tag);
    if (users > 0) {
      throw new ForkdError(
        "conflict",
        `snapshot ${tag} has ${users} running or starting sandboxes; kill them first`,
        {
          tag,
          sandboxes: users,
        },
      );
    }
    await s.sandboxes.forgetSnapshot(tag);
    await s.store.delete(tag);
    return c.json({ deleted: tag });
  });

  return app;
}
