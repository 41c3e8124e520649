/** Routes of sandboxes: fork, list, inspect, kill, branch, pause, resume, timeout, exposed ports and egress. */
import { Hono } from "hono";
import { ForkdError } from "../../util/index.js";
import type { Services } from "../../app/index.js";
import {
  Branch,
  CreateSandboxes,
  EgressRequest,
  ExposePort,
  ListSandboxesQuery,
  MetricsQuery,
  SetDeadline,
  SetTimeout,
} from "../contract/schemas.js";
import type { BranchResult, ForkResult } from "../contract/schemas.js";
import type { z } from "zod";
import { noteTarget } from "../env.js";
import type { ApiContext, ApiEnv } from "../env.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";
import { parseBody, parseQuery } from "../parse.js";
import { sampleUsage } from "../../metrics/index.js";
import { listPage } from "../views/sandbox-page.js";
import { mayHold, tagNames } from "../../app/index.js";
import { branchAs } from "../../app/index.js";
import { forkAs } from "../../app/index.js";
import { killAs, pauseAs, resumeAs } from "../../app/index.js";
import { sandboxView } from "../views/sandbox.js";
import { parseNetwork } from "../../net/index.js";
import { snapshotView } from "../views/snapshot.js";

export function sandboxRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.get("/", (c) => {
    const q = parseQuery(c, ListSandboxesQuery);
    const caller = c.get("caller");
    const all = s.sandboxes.list();
    const mine = all.filter((sb) => mayHold(caller, sb.record.owner));
    const page = listPage(mine, q);
    const names = tagNames(caller);
    return c.json({
      sandboxes: page.items.map((sb) => sandboxView(sb, names, s.info.node ?? null)),
      next_token: page.nextToken,
    });
  });

  app.post("/", async (c) => {
    const body = await parseBody(c, CreateSandboxes);
    const caller = c.get("caller");
    noteTarget(c, "snapshot", body.snapshot_tag);
    const r = await forkAs(s, caller, body.snapshot_tag, body.n, {
      timeoutMs: body.timeout_ms ?? null,
      metadata: body.metadata,
      onIdle: body.on_idle,
      limits: body.limits && {
        memoryMiB: body.limits.memory_mib,
        cpus: body.limits.cpus,
        pids: body.limits.pids,
        diskMiB: body.limits.disk_mib,
        lifetimeMs: body.limits.lifetime_ms,
      },
      network: parseNetwork(body.network),
      env: body.env,
      deadlineMs: body.deadline_ms ?? null,
      onDeadline: body.on_deadline,
    });
    noteTarget(
      c,
      "sandboxes",
      r.sandboxes.map((sb) => sb.record.id),
    );
    const names = tagNames(caller);
    const reply: z.infer<typeof ForkResult> = {
      sandboxes: r.sandboxes.map((sb) => sandboxView(sb, names, s.info.node ?? null)),
      failures: r.failures,
    };
    return c.json(reply, 201);
  });

  const view = (c: ApiContext, sb: ReadonlySandbox) =>
    sandboxView(sb, tagNames(c.get("caller")), s.info.node ?? null);

  app.get("/:id", (c) => c.json(view(c, s.sandboxes.get(c.req.param("id")))));

  app.get("/:id/metrics", async (c) => {
    const q = parseQuery(c, MetricsQuery);
    const sb = s.sandboxes.get(c.req.param("id"));
    const machine = sb.record.paused?.machine ?? (await s.store.get(sb.record.tag)).meta.machine;
    const sample = await sampleUsage({
      pid: sb.state === "running" ? sb.record.pid : null,
      dir: sb.dir,
      vcpus: machine.vcpus,
      memoryMiB: machine.memoryMiB,
      diskMiB: sb.record.limits?.diskMiB ?? null,
    });
    const t = Date.parse(sample.timestamp);
    const inside =
      (q.start === undefined || Date.parse(q.start) <= t) && (q.end === undefined || t <= Date.parse(q.end));
    return c.json({ metrics: inside ? [sample] : [] });
  });

  app.post("/:id/branch", async (c) => {
    const body = await parseBody(c, Branch);
    const caller = c.get("caller");
    const names = tagNames(caller);
    const id = c.req.param("id");
    if (body.tag !== undefined) noteTarget(c, "snapshot", body.tag);
    const r = await branchAs(s, caller, id, body.tag, { wait: body.wait });
    noteTarget(c, "snapshot", names(r.tag));
    const reply: z.infer<typeof BranchResult> = {
      tag: names(r.tag),
      status: r.status,
      pause_ms: r.pauseMs,
      private_bytes: r.privateBytes,
      snapshot: r.snapshot ? snapshotView(r.snapshot.meta, names) : null,
    };
    return c.json(reply, r.status === "ready" ? 201 : 202);
  });

  app.post("/:id/pause", async (c) => c.json(view(c, await pauseAs(s, c.get("caller"), c.req.param("id")))));
  app.post("/:id/resume", async (c) =>
    c.json(view(c, await resumeAs(s, c.get("caller"), c.req.param("id")))),
  );

  app.post("/:id/ports", async (c) => {
    const body = await parseBody(c, ExposePort);
    return c.json(view(c, await s.sandboxes.exposePort(c.req.param("id"), body.port)));
  });

  app.delete("/:id/ports/:port", async (c) => {
    const port = Number(c.req.param("port"));
    if (!/^\d{1,5}$/.test(c.req.param("port")) || port < 1 || port > 65535)
      throw new ForkdError("invalid_argument", "port must be a TCP port (1-65535)", { field: "port" });
    return c.json(view(c, await s.sandboxes.unexposePort(c.req.param("id"), port)));
  });

  app.post("/:id/egress", async (c) => {
    const body = await parseBody(c, EgressRequest);
    const id = c.req.param("id");
    const mode = s.sandboxes.get(id).record.network?.mode ?? "none";
    // The same validation as at creation (errors name network.egress...).
    const { egress } = parseNetwork({ mode: mode === "none" ? "netns" : mode, egress: body });
    return c.json(view(c, await s.sandboxes.setEgress(id, egress)));
  });

  app.post("/:id/timeout", async (c) => {
    const body = await parseBody(c, SetTimeout);
    return c.json(view(c, await s.sandboxes.setIdleTimeout(c.req.param("id"), body.timeout_ms)));
  });

  app.post("/:id/deadline", async (c) => {
    const body = await parseBody(c, SetDeadline);
    return c.json(view(c, await s.sandboxes.setDeadline(c.req.param("id"), body.deadline_ms)));
  });

  app.delete("/:id", async (c) => {
    const id = c.req.param("id");
    await killAs(s, c.get("caller"), id);
    return c.json({ deleted: id });
  });

  return app;
}
