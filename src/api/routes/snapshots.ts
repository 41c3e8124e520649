/** Routes of snapshots: create (optionally streamed), list, inspect, compact, delete, pack, unpack, push and pull. */
import { Hono } from "hono";
import { ForkdError } from "../../util/errors.js";
import { assertTag } from "../../util/ids.js";
import type { Services } from "../services.js";
import { Compact, CreateSnapshot, DeleteSnapshotQuery, Pull, Push, truthy } from "../contract/schemas.js";
import { Readable } from "node:stream";
import { bodyStream, parseBody, parseQuery } from "../parse.js";
import { noteTarget } from "../env.js";
import type { ApiEnv } from "../env.js";
import { isAdmin } from "../../access/caller.js";
import { canSee, noSnapshot, ownedSnapshot, visiblePending, visibleSnapshot } from "../scope.js";
import { hangupSignal, progressStream } from "../stream.js";
import { replyStream } from "../reply-stream.js";
import { snapshotStatusView, snapshotView } from "../views/snapshot.js";
import type { Progress } from "../../snapshot/progress.js";

export function snapshotRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.get("/", async (c) => {
    const caller = c.get("caller");
    const all = await s.snapshots.list();
    return c.json({
      snapshots: all.snapshots.filter((m) => canSee(caller, m.owner)).map(snapshotView),
      pending: visiblePending(caller, all.pending).map(snapshotStatusView),
    });
  });

  // ?stream=1: NDJSON progress lines ({"type":"progress","message"}), then {"type":"done",
  // "snapshot"} or {"type":"error","error"}; otherwise one JSON reply when ready.
  app.post("/", async (c) => {
    const body = await parseBody(c, CreateSnapshot);
    // Exactly one source: an image, or a template (python when neither is named).
    const from = body.image !== undefined ? { image: body.image } : { template: body.template ?? "python" };
    const req = {
      tag: body.tag,
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
      owner: c.get("caller").tenant,
    };
    noteTarget(c, "snapshot", body.tag);
    // A client that hangs up before the snapshot is published cancels its creation (as Ctrl-C
    // stops `docker build`): its parent VM is killed, nothing is published or pre-started.
    if (c.req.query("stream") !== "1")
      return c.json(snapshotView(await s.snapshots.create({ ...req, signal: hangupSignal(c) })), 201);
    // Refuse a taken tag, an unknown template or an image this daemon cannot pull with a status
    // code, before the stream starts.
    await s.snapshots.checkCreatable(body.tag, from, req.owner);
    return progressStream(
      c,
      201,
      "snapshot",
      `snapshot ${body.tag}`,
      s.log,
      async (progress, watcher) =>
        snapshotView(await s.snapshots.create({ ...req, signal: watcher.signal }, progress)),
      "cancel",
    );
  });

  app.get("/:tag", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    const caller = c.get("caller");
    if (!(await s.snapshots.has(tag))) {
      const p = await s.snapshots.pending(tag);
      if (p) {
        if (!canSee(caller, p.owner)) throw noSnapshot(tag);
        return c.json(snapshotStatusView(p));
      }
    }
    return c.json(snapshotView((await visibleSnapshot(s, caller, tag)).meta));
  });

  app.get("/:tag/info", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    const caller = c.get("caller");
    await visibleSnapshot(s, caller, tag);
    const info = await s.snapshots.info(tag);
    // Branches other tenants stacked on a shared snapshot are theirs to know about.
    const { snapshots } = await s.snapshots.list();
    const visible = new Set(snapshots.filter((m) => canSee(caller, m.owner)).map((m) => m.tag));
    return c.json({ ...info, dependents: info.dependents.filter((t) => visible.has(t)) });
  });

  app.get("/:tag/pack", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    await visibleSnapshot(s, c.get("caller"), tag); // 404 / corrupt before the stream starts
    // At the reader's pace; a client that hangs up ends the writer (tar, staging directory).
    const body = replyStream(
      (sink) => {
        if (sink.gone) return; // gone before the reply started: nothing is packed
        s.snapshots.pack(tag, sink.writable()).catch((e: unknown) => {
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
        "content-disposition": `attachment; filename="${tag}.forkd.tar.zst"`,
      },
    });
  });

  app.post("/unpack", async (c) => {
    const body = bodyStream(c);
    if (!body) throw new ForkdError("invalid_argument", "the request body must be a pack");
    const r = await s.snapshots.unpack(Readable.from(body), c.get("caller").tenant);
    noteTarget(c, "published", r.published);
    return c.json(r, 201);
  });

  // Synchronous (one JSON reply when done), or ?stream=1: NDJSON progress (api/stream.ts).
  app.post("/:tag/push", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    const body = await parseBody(c, Push);
    await visibleSnapshot(s, c.get("caller"), tag); // 404 / corrupt with a status, before any stream starts
    noteTarget(c, "snapshot", tag);
    const work = (progress: Progress) =>
      s.snapshots.push(tag, body.ref, { insecure: body.insecure }, progress);
    if (c.req.query("stream") === "1") return progressStream(c, 200, "result", `push ${tag}`, s.log, work);
    return c.json(await work(() => undefined), 200);
  });

  app.post("/pull", async (c) => {
    const body = await parseBody(c, Pull);
    const owner = c.get("caller").tenant;
    if (body.tag !== undefined) noteTarget(c, "snapshot", body.tag);
    const req = {
      ...(body.ref !== undefined ? { ref: body.ref } : {}),
      ...(body.url !== undefined ? { url: body.url } : {}),
      ...(body.tag !== undefined ? { tag: body.tag } : {}),
      insecure: body.insecure,
    };
    const work = (progress: Progress) => s.snapshots.pull(req, owner, progress);
    if (c.req.query("stream") === "1") return progressStream(c, 201, "result", "pull", s.log, work);
    return c.json(await work(() => undefined), 201);
  });

  // The copy belongs to the source's owner: a tenant compacts only its own snapshots.
  app.post("/:tag/compact", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    const body = await parseBody(c, Compact);
    await ownedSnapshot(s, c.get("caller"), tag);
    noteTarget(c, "snapshot", body.tag);
    return c.json(snapshotView(await s.snapshots.compact(tag, body.tag)), 201);
  });

  app.delete("/:tag", async (c) => {
    const tag = assertTag(c.req.param("tag"));
    const q = parseQuery(c, DeleteSnapshotQuery);
    const caller = c.get("caller");
    if (!isAdmin(caller)) await ownedSnapshot(s, caller, tag);
    const opts = { cascade: truthy(q.cascade), force: truthy(q.force) };
    if (truthy(q.dry_run)) {
      const plan = await s.snapshots.planDelete(tag, opts);
      const removed = new Set(plan.inUse);
      const sandboxes = s.sandboxes
        .list()
        .filter((sb) => removed.has(sb.record.tag) && (isAdmin(caller) || sb.record.owner === caller.tenant))
        .map((sb) => sb.record.id);
      return c.json({
        tag,
        dry_run: true as const,
        deletes: plan.deletes,
        orphaned: plan.orphans,
        dependents: plan.blockingDependents,
        sandboxes,
        refused: plan.inUse.length > 0 || plan.blockingDependents.length > 0,
      });
    }
    const r = await s.snapshots.delete(tag, opts);
    return c.json({ deleted: tag, ...r });
  });

  return app;
}
