/** Routes of snapshots: create (optionally streamed), list, inspect, compact, delete, pack, unpack, push and pull. */
import { Hono } from "hono";
import { ForkdError } from "../../util/index.js";
import type { Services } from "../../app/index.js";
import { Compact, CreateSnapshot, DeleteSnapshotQuery, Pull, Push, truthy } from "../contract/schemas.js";
import { Readable } from "node:stream";
import { bodyStream, parseBody, parseQuery } from "../parse.js";
import { noteTarget } from "../env.js";
import type { ApiEnv } from "../env.js";
import { buildCapsOf, checkBuildSize } from "../../access/index.js";
import { isAdmin } from "../../access/index.js";
import { splitKey } from "../../snapshot/index.js";
import { TENANT_RE } from "../../util/index.js";
import {
  newSnapshotKey,
  ownedSnapshot,
  tagNames,
  viewerOf,
  visibleMetas,
  visibleSnapshot,
} from "../../app/index.js";
import { deleteSnapshotAs, planDeleteAs, snapshotAs, snapshotsOf } from "../../app/index.js";
import { creationReply, progressStream } from "../stream.js";
import { replyStream } from "../../http/index.js";
import { snapshotStatusView, snapshotView } from "../views/snapshot.js";
import type { Progress } from "../../util/index.js";

export function snapshotRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.get("/", async (c) => {
    const caller = c.get("caller");
    const names = tagNames(caller);
    const all = await snapshotsOf(s, caller);
    return c.json({
      snapshots: all.snapshots.map((m) => snapshotView(m, names)),
      pending: all.pending.map((p) => snapshotStatusView(p, names)),
    });
  });

  // ?stream=1: NDJSON progress lines ({"type":"progress","message"}), then {"type":"done",
  // "snapshot"} or {"type":"error","error"}; otherwise one JSON reply when ready.
  app.post("/", async (c) => {
    const body = await parseBody(c, CreateSnapshot);
    // A tenant's parent VM is held to its caps (403 naming the one it is over).
    checkBuildSize(buildCapsOf(c.get("caller"), s.limits.buildCaps), {
      memoryMiB: body.memory_mib,
      vcpus: body.vcpus,
    });
    // Exactly one source: an image, or a template (python when neither is named).
    const from = body.image !== undefined ? { image: body.image } : { template: body.template ?? "python" };
    const caller = c.get("caller");
    const names = tagNames(caller);
    noteTarget(c, "snapshot", body.tag);
    const { key, owner } = await newSnapshotKey(s, caller, body.tag);
    const req = {
      tag: key,
      from,
      startCmd: body.start_cmd ?? null,
      readyCmd: body.ready_cmd ?? null,
      readyTimeoutMs: body.ready_timeout_ms,
      warm: body.warm ?? null,
      warmEval: body.warm_eval ?? null,
      warmEvalLanguage: body.warm_eval_language,
      nic: body.nic,
      memoryMiB: body.memory_mib,
      vcpus: body.vcpus,
      owner,
    };
    // A client that hangs up before the snapshot is published cancels its creation (as Ctrl-C
    // stops `docker build`): its parent VM is killed, nothing is published or pre-started.
    const streamed = c.req.query("stream") === "1";
    // Streamed: refuse a taken tag, an unknown template or an image this daemon cannot pull with
    // a status code, before the stream starts.
    if (streamed) await s.snapshots.checkCreatable(key, from, req.owner);
    return creationReply(c, streamed, "snapshot", `snapshot ${key}`, s.log, async (signal, progress) =>
      snapshotView(await s.snapshots.create({ ...req, signal }, progress), names),
    );
  });

  app.get("/:tag", async (c) => {
    const caller = c.get("caller");
    const snap = await snapshotAs(s, caller, c.req.param("tag"));
    if ("pending" in snap) return c.json(snapshotStatusView(snap.pending, tagNames(caller)));
    return c.json(snapshotView(snap.meta, tagNames(caller)));
  });

  app.get("/:tag/info", async (c) => {
    const caller = c.get("caller");
    const names = tagNames(caller);
    const { key } = await visibleSnapshot(s, caller, c.req.param("tag"));
    const info = await s.snapshots.info(key);
    // Branches other tenants stacked on a shared snapshot are theirs to know about.
    const { snapshots } = await s.snapshots.list();
    const visible = new Set(visibleMetas(caller, snapshots).map((m) => m.tag));
    return c.json({
      ...info,
      tag: names(info.tag),
      ancestors: info.ancestors.map(names),
      dependents: info.dependents.filter((t) => visible.has(t)).map(names),
    });
  });

  app.get("/:tag/pack", async (c) => {
    const tag = c.req.param("tag");
    const { key } = await visibleSnapshot(s, c.get("caller"), tag); // 404 / corrupt before the stream starts
    // At the reader's pace; a client that hangs up ends the writer (tar, staging directory).
    const body = replyStream(
      (sink) => {
        if (sink.gone) return; // gone before the reply started: nothing is packed
        s.snapshots.pack(key, sink.writable()).catch((e: unknown) => {
          if (sink.gone) s.log.info("pack not sent: its client went away", { tag });
          else s.log.warn("pack failed", { tag, error: String(e) });
          sink.fail(e);
        });
      },
      { outgoing: c.env?.outgoing },
    );
    return new Response(body, {
      status: 200,
      headers: {
        "content-type": "application/zstd",
        "content-disposition": `attachment; filename="${tag.replace("/", "~")}.forkd.tar.zst"`,
      },
    });
  });

  app.post("/unpack", async (c) => {
    const body = bodyStream(c);
    if (!body) throw new ForkdError("invalid_argument", "the request body must be a pack");
    const caller = c.get("caller");
    const names = tagNames(caller);
    const r = await s.snapshots.unpack(Readable.from(body), viewerOf(caller));
    noteTarget(c, "published", r.published.map(names));
    return c.json({ tag: names(r.tag), published: r.published.map(names) }, 201);
  });

  // Synchronous (one JSON reply when done), or ?stream=1: NDJSON progress (api/stream.ts).
  app.post("/:tag/push", async (c) => {
    const tag = c.req.param("tag");
    const body = await parseBody(c, Push);
    noteTarget(c, "snapshot", tag);
    // 404 / corrupt with a status, before any stream starts
    const { key } = await visibleSnapshot(s, c.get("caller"), tag);
    const work = async (progress: Progress) => ({
      ...(await s.snapshots.push(key, body.ref, { insecure: body.insecure }, progress)),
      tag,
    });
    if (c.req.query("stream") === "1") return progressStream(c, 200, "result", `push ${tag}`, s.log, work);
    return c.json(await work(() => undefined), 200);
  });

  app.post("/pull", async (c) => {
    const body = await parseBody(c, Pull);
    const caller = c.get("caller");
    const names = tagNames(caller);
    if (body.tag !== undefined) noteTarget(c, "snapshot", body.tag);
    const req = {
      ...(body.ref !== undefined ? { ref: body.ref } : {}),
      ...(body.url !== undefined ? { url: body.url } : {}),
      ...(body.peer !== undefined ? { peer: body.peer } : {}),
      ...(body.tag !== undefined ? { tag: body.tag } : {}),
      insecure: body.insecure,
    };
    const work = async (progress: Progress) => {
      const r = await s.snapshots.pull(req, viewerOf(caller), progress);
      return { ...r, tag: names(r.tag), published: r.published.map(names) };
    };
    if (c.req.query("stream") === "1") return progressStream(c, 201, "result", "pull", s.log, work);
    return c.json(await work(() => undefined), 201);
  });

  // The copy belongs to the source's owner: a tenant compacts only its own snapshots.
  app.post("/:tag/compact", async (c) => {
    const tag = c.req.param("tag");
    const body = await parseBody(c, Compact);
    const caller = c.get("caller");
    noteTarget(c, "snapshot", body.tag);
    const src = await ownedSnapshot(s, caller, tag);
    // The copy is the source's owner's (it keeps its owner): an admin's copy of a tenant's
    // snapshot is in that tenant's namespace.
    const owner = src.meta.owner ?? null;
    const ns = splitKey(src.key).ns ?? (owner !== null && TENANT_RE.test(owner) ? owner : null);
    const dest =
      ns !== null && isAdmin(caller) && splitKey(body.tag).ns === null ? `${ns}/${body.tag}` : body.tag;
    const { key } = await newSnapshotKey(s, caller, dest);
    return c.json(snapshotView(await s.snapshots.compact(src.key, key), tagNames(caller)), 201);
  });

  app.delete("/:tag", async (c) => {
    const tag = c.req.param("tag");
    const q = parseQuery(c, DeleteSnapshotQuery);
    const caller = c.get("caller");
    const names = tagNames(caller);
    const opts = { cascade: truthy(q.cascade), force: truthy(q.force) };
    if (truthy(q.dry_run)) {
      const { plan, sandboxes } = await planDeleteAs(s, caller, tag, opts);
      return c.json({
        tag,
        dry_run: true as const,
        deletes: plan.deletes.map(names),
        orphaned: plan.orphans.map(names),
        dependents: plan.blockingDependents.map(names),
        sandboxes,
        refused: plan.inUse.length > 0 || plan.blockingDependents.length > 0,
      });
    }
    const r = await deleteSnapshotAs(s, caller, tag, opts);
    return c.json({
      deleted: tag,
      ...(r.cascaded ? { cascaded: r.cascaded.map(names) } : {}),
      ...(r.orphaned ? { orphaned: r.orphaned.map(names) } : {}),
    });
  });

  return app;
}
