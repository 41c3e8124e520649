import { Hono } from "hono";
import { ForkdError } from "../../util/errors.js";
import { assertTag } from "../../util/ids.js";
import { createSnapshot } from "../../snapshot/create.js";
import type { Services } from "../services.js";
import { CreateSnapshot } from "../schemas.js";
import { parseBody } from "../parse.js";

export function snapshotRoutes(s: Services): Hono {
  const app = new Hono();

  app.get("/", async (c) => c.json({ snapshots: await s.store.list() }));

  app.post("/", async (c) => {
    const body = await parseBody(c, CreateSnapshot);
    const meta = await createSnapshot(
      s.snapshotDeps,
      {
        tag: body.tag,
        template: body.template,
        warm: body.warm ?? null,
        warmEval: body.warm_eval ?? null,
        memoryMiB: body.memory_mib,
        vcpus: body.vcpus,
      },
      (line) => s.log.info(`snapshot ${body.tag}: ${line}`),
    );
    s.log.info("snapshot created", { tag: meta.tag });
    return c.json(meta, 201);
  });

  app.get("/:tag", async (c) => c.json((await s.store.get(assertTag(c.req.param("tag")))).meta));

  app.delete("/:tag", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    const users = s.sandboxes.countByTag(tag);
    if (users > 0) {
      throw new ForkdError("conflict", `snapshot ${tag} has ${users} running sandboxes; kill them first`, {
        tag,
        sandboxes: users,
      });
    }
    await s.sandboxes.forgetSnapshot(tag);
    await s.store.delete(tag);
    return c.json({ deleted: tag });
  });

  return app;
}
