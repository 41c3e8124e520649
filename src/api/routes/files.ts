/**
 * Files in a sandbox: binary-safe download and upload (streamed; an upload may be gzipped), list,
 * stat, mkdir, remove, rename.
 */
import { Readable, pipeline } from "node:stream";
import { createGunzip } from "node:zlib";
import { Hono } from "hono";
import type { Services } from "../../app/index.js";
import type { ApiEnv } from "../env.js";
import { Mkdir, PathQuery, RemoveQuery, Rename, WriteQuery, truthy } from "../contract/schemas.js";
import { bodyStream, parseBody, parseQuery } from "../parse.js";
import type { ApiContext } from "../env.js";
import { DEFAULT_BODY_LIMITS, tooLarge } from "../../app/index.js";
import { ForkdError } from "../../util/index.js";
import { clientGone, replyStream } from "../../http/index.js";
import { dirListView, fileStatView } from "../views/file.js";

/**
 * An upload's bytes: the body as sent, or (Content-Encoding: gzip) decompressed, the route's bound
 * then applying to the decompressed bytes too (a small body cannot expand without bound). Ending
 * the iteration early (the write failed) or a client that hangs up mid-body tears the pipeline down.
 */
function uploadBody(c: ApiContext): AsyncIterable<Uint8Array> | null {
  const enc = (c.req.header("content-encoding") ?? "identity").trim().toLowerCase();
  if (enc !== "gzip" && enc !== "identity") {
    throw new ForkdError("invalid_argument", `unsupported Content-Encoding ${enc} (gzip or none)`, {
      encoding: enc,
    });
  }
  const raw = bodyStream(c);
  if (enc === "identity" || raw === null) return raw;
  return gunzipBounded(raw, c.get("bodyLimit") ?? DEFAULT_BODY_LIMITS.upload);
}

/** `raw` gunzipped, failing with a 413 past `max` decompressed bytes and a 400 on bad gzip. */
export async function* gunzipBounded(raw: AsyncIterable<Uint8Array>, max: number): AsyncIterable<Uint8Array> {
  const gz = pipeline(Readable.from(raw), createGunzip(), () => undefined);
  let size = 0;
  try {
    for await (const chunk of gz as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > max) throw tooLarge(max);
      yield new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.length);
    }
  } catch (e) {
    if (e instanceof ForkdError) throw e;
    throw new ForkdError("invalid_argument", `the gzip body is not valid: ${String(e)}`);
  } finally {
    gz.destroy();
  }
}

export function fileRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.get("/:id/files", async (c) => {
    const { path } = parseQuery(c, PathQuery);
    const lease = s.sandboxes.lease(c.req.param("id"));
    const agent = lease.agent;
    let st;
    try {
      st = await agent.stat(path);
      if (st.type !== "file")
        throw new ForkdError("invalid_argument", `${path} is not a regular file`, { path });
    } catch (e) {
      lease.release();
      throw e;
    }
    // Paced by the client: the guest reads the file as the client takes it. A client that hangs
    // up ends the read (the guest's stream is cancelled) and the sandbox is released.
    const stream = replyStream(
      (sink) => {
        if (sink.gone) return lease.release(); // gone during the stat: nothing is read
        const stillThere = () => {
          if (sink.gone) throw clientGone();
        };
        agent
          .readFileStream(path, (chunk) => {
            stillThere();
            return sink.write(new Uint8Array(chunk)) || sink.drained().then(stillThere);
          })
          .then(
            () => sink.end(),
            (e: unknown) => sink.fail(e),
          )
          .finally(lease.release);
      },
      { outgoing: c.env?.outgoing },
    );
    return new Response(stream, {
      status: 200,
      headers: { "content-type": "application/octet-stream", "x-forkd-file-size": String(st.size) },
    });
  });

  app.put("/:id/files", async (c) => {
    const q = parseQuery(c, WriteQuery);
    // Streamed to the guest within the upload bound; past it the file is not replaced (413).
    const body = uploadBody(c);
    const size = await s.sandboxes.use(c.req.param("id"), (agent) =>
      agent.writeFile(q.path, body ?? new Uint8Array(0), {
        mode: q.mode,
        makeParents: truthy(q.parents),
      }),
    );
    return c.json({ path: q.path, size }, 201);
  });

  app.delete("/:id/files", async (c) => {
    const q = parseQuery(c, RemoveQuery);
    await s.sandboxes.use(c.req.param("id"), (a) => a.remove(q.path, { recursive: truthy(q.recursive) }));
    return c.json({ deleted: q.path });
  });

  app.get("/:id/files/stat", async (c) => {
    const { path } = parseQuery(c, PathQuery);
    return c.json(fileStatView(path, await s.sandboxes.use(c.req.param("id"), (a) => a.stat(path))));
  });

  app.get("/:id/files/list", async (c) => {
    const { path } = parseQuery(c, PathQuery);
    return c.json(dirListView(path, await s.sandboxes.use(c.req.param("id"), (a) => a.list(path))));
  });

  app.post("/:id/files/mkdir", async (c) => {
    const b = await parseBody(c, Mkdir);
    await s.sandboxes.use(c.req.param("id"), (a) => a.mkdir(b.path, { parents: b.parents }));
    return c.json({ path: b.path }, 201);
  });

  app.post("/:id/files/rename", async (c) => {
    const b = await parseBody(c, Rename);
    await s.sandboxes.use(c.req.param("id"), (a) => a.rename(b.from, b.to));
    return c.json({ from: b.from, to: b.to });
  });

  return app;
}
