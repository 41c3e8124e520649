/**
 * The peer routes (/peer/v1/), served on a node's TCP listener next to the REST API when the
 * cluster has a secret (FORKD_CLUSTER_SECRET_FILE): what another node of the cluster needs to
 * pull a snapshot this node holds (docs/snapshot-format.md, "Peers").
 *
 *   GET /peer/v1/snapshots/<key>/manifest   the chain's peer manifest (store keys, owners, files
 *                                           with sizes and sha256: src/snapshot/peer-manifest.ts);
 *                                           <key> as `alice%2Fapp` or `alice/app`
 *   GET /peer/v1/blobs/sha256:<hex>         the bytes of a file this node holds with that sum (a
 *                                           snapshot's own file, or an image file of a snapshot it
 *                                           holds: nothing else), `Range: bytes=N-` → 206
 *
 * Only a caller with the cluster's peer bearer gets in (access/cluster-secret.ts, compared in
 * constant time); an API token, admin or tenant, is refused like any other. A blob is read at
 * its client's pace (http/reply-stream.ts): a client that hangs up at any byte closes the file
 * and costs nothing more; one that reads nothing for a minute is taken for gone. Errors are the
 * API's envelope, {"error": {"code", "message"}}, with the same statuses.
 */
import { open } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import { Hono } from "hono";
import type { Context } from "hono";
import type { HttpBindings } from "@hono/node-server";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { PEER_PURPOSE } from "../access/index.js";
import type { ClusterSecret } from "../access/index.js";
import { replyStream } from "../http/index.js";
import type { SnapshotService } from "../snapshot/index.js";
import { ForkdError, errorMessage, statusOf } from "../util/index.js";
import type { Logger } from "../util/index.js";
import { byteRange } from "./range.js";

export interface PeerServices {
  snapshots: Pick<SnapshotService, "peerManifest" | "heldFile">;
  secret: ClusterSecret;
  log: Logger;
}

type PeerEnv = { Bindings: Partial<HttpBindings> };

/** A reader of a blob that takes nothing for this long is taken for gone (its file closed). */
const STALL_MS = 60_000;

const MANIFEST_PATH = /^\/peer\/v1\/snapshots\/(.+)\/manifest$/;
const BLOB_PATH = /^\/peer\/v1\/blobs\/sha256:([0-9a-f]{64})$/;

function errorReply(c: Pick<Context<PeerEnv>, "json">, e: unknown): Response {
  if (e instanceof ForkdError)
    return c.json({ error: { code: e.code, message: e.message } }, statusOf(e.code) as ContentfulStatusCode);
  return c.json({ error: { code: "internal", message: "internal error" } }, 500);
}

export function createPeerApp(s: PeerServices): Hono<PeerEnv> {
  const app = new Hono<PeerEnv>();
  app.onError((e, c) => {
    if (!(e instanceof ForkdError))
      s.log.warn("peer route failed", { error: errorMessage(e), path: c.req.path });
    return errorReply(c, e);
  });
  app.notFound((c) => errorReply(c, new ForkdError("not_found", `no route ${c.req.method} ${c.req.path}`)));

  app.use("*", async (c, next) => {
    if (!s.secret.accepts(c.req.header("authorization"), PEER_PURPOSE)) {
      c.header("www-authenticate", 'Bearer realm="forkd-peer"');
      return errorReply(c, new ForkdError("unauthenticated", "a peer route needs the cluster's peer bearer"));
    }
    await next();
    return undefined;
  });

  app.get("/peer/v1/snapshots/*", async (c) => {
    // The raw path: a key's "/" may come encoded (alice%2Fapp) or as it is (alice/app).
    const m = MANIFEST_PATH.exec(new URL(c.req.url).pathname);
    if (!m) throw new ForkdError("not_found", `no route ${c.req.method} ${c.req.path}`);
    let key: string;
    try {
      key = decodeURIComponent(m[1] ?? "");
    } catch {
      throw new ForkdError("invalid_argument", "a key in the path is not valid percent-encoding");
    }
    return c.json(await s.snapshots.peerManifest(key));
  });

  app.get("/peer/v1/blobs/*", async (c) => {
    const m = BLOB_PATH.exec(new URL(c.req.url).pathname);
    if (!m) throw new ForkdError("invalid_argument", "a blob is named sha256:<64 lowercase hex digits>");
    const held = await s.snapshots.heldFile(m[1] ?? "");
    // Opened before the reply starts: a file gone meanwhile is a 404, not a cut 200.
    const fh = await open(held.src, "r").catch(() => null);
    const st = await fh?.stat().catch(() => null);
    if (!fh || !st || st.size !== held.size) {
      await fh?.close();
      throw new ForkdError("not_found", `the file with sha256 ${held.sha256} changed here`);
    }
    const r = byteRange(c.req.header("range"), held.size);
    if (r === "unsatisfiable") {
      await fh.close();
      c.header("content-range", `bytes */${held.size}`);
      return c.json({ error: { code: "invalid_argument", message: "range not satisfiable" } }, 416);
    }
    const start = r?.start ?? 0;
    const end = r?.end ?? held.size - 1;
    const length = end - start + 1;
    const body = replyStream(
      (sink) => {
        if (sink.gone || length <= 0) {
          void fh.close();
          if (!sink.gone) sink.end();
          return;
        }
        const file = fh.createReadStream({ start, end, highWaterMark: 1 << 20, autoClose: true });
        pipeline(file, sink.writable())
          .catch((e: unknown) => {
            if (!sink.gone) s.log.warn("peer blob not sent", { sha256: held.sha256, error: errorMessage(e) });
            sink.fail(e);
          })
          .finally(() => void fh.close().catch(() => undefined));
      },
      { outgoing: c.env?.outgoing, stallMs: STALL_MS, highWaterMark: 8 << 20 },
    );
    return new Response(body, {
      status: r ? 206 : 200,
      headers: {
        "content-type": "application/octet-stream",
        "content-length": String(length),
        "accept-ranges": "bytes",
        ...(r ? { "content-range": `bytes ${start}-${end}/${held.size}` } : {}),
      },
    });
  });
  return app;
}
