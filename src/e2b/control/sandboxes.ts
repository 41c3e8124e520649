/**
 * E2B's sandbox routes over forkd's sandbox service: create (a fork of the snapshot named by
 * templateID), get, list (v1, and v2 with its query and X-Next-Token pagination), kill, timeout
 * (forkd's absolute deadline), pause, resume and connect (which resumes a paused sandbox and only
 * ever extends its deadline), refreshes, fork (one branch of the running source serves every
 * fork) and metrics. A sandbox that is not the caller's is a 404, as one that does not exist.
 */
import { Hono } from "hono";
import type { E2bServices } from "../context.js";
import { branchThenFork } from "../../app/index.js";
import { forkAs } from "../../app/index.js";
import type { CallerForkOptions } from "../../app/index.js";
import { killAs, pauseAs, resumeAs } from "../../app/index.js";
import { liveSandbox, tagNames } from "../../app/index.js";
import type { ReadonlySandbox } from "../../sandbox/index.js";
import { ForkdError } from "../../util/index.js";
import { e2bOf } from "../auth.js";
import { e2bError } from "../errors.js";
import type { E2bApiContext, E2bEnv } from "./env.js";
import { noteE2bTarget } from "./env.js";
import { listSandboxes } from "./list.js";
import { sandboxMetrics } from "./metrics.js";
import { networkOf } from "./network.js";
import { readJson, readQuery } from "./parse.js";
import {
  ConnectBody,
  ForkBody,
  ListQuery,
  NetworkUpdate,
  NewSandbox,
  PauseBody,
  RefreshBody,
  ResumeBody,
  TimeoutBody,
} from "./schemas.js";
import { detailView, endAtOf, sandboxReply } from "./views.js";

/** E2B's defaults, in seconds: v2 creation, connect and fork 300; v1 creation, resume and fork 15. */
const V2_TIMEOUT_S = 300;
const V1_TIMEOUT_S = 15;

export function sandboxRoutes(s: E2bServices): Hono<E2bEnv> {
  const app = new Hono<E2bEnv>();
  const json = s.limits.body.json;
  const caller = (c: E2bApiContext) => c.get("caller");
  /** The caller's sandbox (running or paused), else not found. */
  const visible = (c: E2bApiContext) => liveSandbox(s, caller(c), idOf(c));
  const idOf = (c: E2bApiContext) => {
    const id = c.req.param("sandboxID") ?? "";
    noteE2bTarget(c, "sandbox", id);
    return id;
  };

  const create = (v2: boolean) => async (c: E2bApiContext) => {
    const b = await readJson(c, NewSandbox, json);
    const who = caller(c);
    const tag = b.templateID;
    noteE2bTarget(c, "template", tag);
    if (b.volumeMounts && b.volumeMounts.length > 0)
      throw new ForkdError("invalid_argument", "volumeMounts are not supported");
    if (b.mcp) throw new ForkdError("invalid_argument", "mcp (the MCP gateway) is not supported");
    if (b.iam?.tokens && Object.keys(b.iam.tokens).length > 0)
      throw new ForkdError("invalid_argument", "iam tokens are not supported");
    const network = networkOf(s.sandboxes.networkStatus(), b.allow_internet_access, b.network);
    const timeoutS = b.timeout ?? (v2 ? V2_TIMEOUT_S : V1_TIMEOUT_S);
    const opts: CallerForkOptions = {
      metadata: b.metadata ?? {},
      env: b.envVars ?? undefined,
      deadlineMs: timeoutS * 1000,
      onDeadline: b.autoPause ? "pause" : "kill",
      network,
      e2b: {
        secure: v2 ? true : b.secure === true,
        ...(b.autoResume?.enabled ? { autoResume: true } : {}),
        timeoutMs: timeoutS * 1000,
        allowInternetAccess: b.allow_internet_access ?? null,
        ...(b.network?.allowOut || b.network?.denyOut
          ? { network: { allowOut: b.network.allowOut, denyOut: b.network.denyOut } }
          : {}),
      },
    };
    // A template the caller cannot see (or a malformed name) is E2B's "template not found".
    const r = await forkAs(
      s,
      who,
      tag,
      1,
      opts,
      () => new ForkdError("not_found", `template ${tag} not found`, { tag }),
    );
    const sb = r.sandboxes[0]!; // forkAs throws when every child failed
    noteE2bTarget(c, "sandboxes", [sb.record.id]);
    return c.json(sandboxReply(e2bOf(s), sb, caller(c)), 201);
  };
  app.post("/sandboxes", create(false));
  app.post("/v2/sandboxes", create(true));

  app.get("/sandboxes", async (c) => {
    const q = readQuery(c, ListQuery);
    const page = await listSandboxes(s, caller(c), {
      metadata: q.metadata,
      state: "running",
      limit: Infinity,
    });
    return c.json(page.items);
  });
  app.get("/v2/sandboxes", async (c) => {
    const q = readQuery(c, ListQuery);
    const page = await listSandboxes(s, caller(c), {
      metadata: q.metadata,
      state: q.state,
      limit: q.limit ?? 100,
      nextToken: q.nextToken,
      order: q.order,
      startedAfter: q.startedAfter,
      template: q.template,
    });
    if (page.nextToken) c.header("X-Next-Token", page.nextToken);
    c.header("X-Total-Running", String(page.running));
    return c.json(page.items);
  });

  app.get("/sandboxes/:sandboxID", async (c) => c.json(await detailView(s, e2bOf(s), visible(c), caller(c))));

  app.delete("/sandboxes/:sandboxID", async (c) => {
    await killAs(s, caller(c), visible(c).record.id);
    return c.body(null, 204);
  });

  app.post("/sandboxes/:sandboxID/timeout", async (c) => {
    const b = await readJson(c, TimeoutBody, json);
    const id = visible(c).record.id;
    await s.sandboxes.setDeadline(id, b.timeout * 1000);
    return c.body(null, 204);
  });

  app.post("/sandboxes/:sandboxID/refreshes", async (c) => {
    const b = await readJson(c, RefreshBody, json);
    const sb = visible(c);
    await extend(s, sb, (b.duration ?? 60) * 1000);
    return c.body(null, 204);
  });

  app.post("/sandboxes/:sandboxID/pause", async (c) => {
    await readJson(c, PauseBody, json);
    const sb = visible(c);
    if (sb.state === "paused") throw new ForkdError("conflict", `sandbox ${sb.record.id} is already paused`);
    // Paused, it has no timeout (E2B's semantics; the pause's own record write clears it):
    // connect or resume sets a new one.
    await pauseAs(s, caller(c), sb.record.id);
    return c.body(null, 204);
  });

  // Resume: a paused sandbox runs again with a new deadline; a running one is a conflict.
  app.post("/sandboxes/:sandboxID/resume", async (c) => {
    const b = await readJson(c, ResumeBody, json);
    const sb = visible(c);
    if (sb.state !== "paused") throw new ForkdError("conflict", `sandbox ${sb.record.id} is already running`);
    const id = sb.record.id;
    await resumeAs(s, caller(c), id, { deadlineMs: (b.timeout ?? V1_TIMEOUT_S) * 1000 });
    return c.json(sandboxReply(e2bOf(s), s.sandboxes.get(id), caller(c)), 201);
  });

  // Connect: 200 for a running sandbox (its deadline only ever extended), 201 for one resumed.
  const connect = (v2: boolean) => async (c: E2bApiContext) => {
    const b = await readJson(c, ConnectBody, json);
    if (!v2 && b.timeout === undefined)
      throw new ForkdError("invalid_argument", "invalid request body: timeout: required");
    const sb = visible(c);
    const id = sb.record.id;
    const ms = (b.timeout ?? V2_TIMEOUT_S) * 1000;
    if (sb.state === "paused") {
      await resumeAs(s, caller(c), id, { deadlineMs: ms });
      return c.json(sandboxReply(e2bOf(s), s.sandboxes.get(id), caller(c)), 201);
    }
    await extend(s, sb, ms);
    return c.json(sandboxReply(e2bOf(s), sb, caller(c)), 200);
  };
  app.post("/sandboxes/:sandboxID/connect", connect(false));
  app.post("/v2/sandboxes/:sandboxID/connect", connect(true));

  // v1's fork defaults to 15 s, v2's (newer SDKs) to 300 s.
  const forkRoute = (v2: boolean) => async (c: E2bApiContext) => {
    const b = await readJson(c, ForkBody, json);
    const who = caller(c);
    const count = b.count ?? 1;
    const timeoutMs = (b.timeout ?? (v2 ? V2_TIMEOUT_S : V1_TIMEOUT_S)) * 1000;
    const { branch, children: r } = await branchThenFork(s, who, idOf(c), count, (src) => ({
      deadlineMs: timeoutMs,
      e2b: { ...(src.record.e2b ?? { secure: true }), timeoutMs },
    }));
    noteE2bTarget(c, "snapshot", tagNames(who)(branch.tag));
    noteE2bTarget(
      c,
      "sandboxes",
      r.sandboxes.map((x) => x.record.id),
    );
    // One entry per fork, in order: its sandbox, or its error.
    const e = e2bOf(s);
    const out: unknown[] = Array.from({ length: count }, () => null);
    const failed = new Set(r.failures.map((f) => f.index));
    let next = 0;
    for (let i = 0; i < count; i++) {
      const f = r.failures.find((x) => x.index === i);
      if (f) out[i] = { error: e2bError(new ForkdError(f.code, f.message), who, s.info.hostDirs).body };
      else if (!failed.has(i)) {
        const sb = r.sandboxes[next++];
        if (sb) out[i] = { sandbox: sandboxReply(e, sb, who) };
      }
    }
    return c.json(out, 201);
  };
  app.post("/sandboxes/:sandboxID/fork", forkRoute(false));
  app.post("/v2/sandboxes/:sandboxID/fork", forkRoute(true));

  // The egress of a running sandbox with a network, replaced (forkd cannot add a network later).
  app.put("/sandboxes/:sandboxID/network", async (c) => {
    const b = await readJson(c, NetworkUpdate, json);
    const sb = visible(c);
    const mode = sb.record.network?.mode ?? "none";
    if (sb.state !== "running") throw new ForkdError("conflict", `sandbox ${sb.record.id} is not running`);
    if (mode === "none")
      throw new ForkdError(
        "conflict",
        `sandbox ${sb.record.id} has no network (it was created without internet access); forkd cannot add one to a running sandbox`,
      );
    const spec = networkOf({ netns: mode === "netns", user: mode === "user" }, b.allow_internet_access, b);
    await s.sandboxes.setEgress(
      sb.record.id,
      spec.mode === "none" ? { mode: "deny", allow: [], dns: false } : spec.egress,
    );
    // What getInfo echoes; a sandbox made through forkd's own API has no E2B settings to keep.
    const x = sb.record.e2b;
    if (x)
      await s.sandboxes.setE2bSettings(sb.record.id, {
        ...x,
        allowInternetAccess: b.allow_internet_access ?? null,
        network: b.allowOut || b.denyOut ? { allowOut: b.allowOut, denyOut: b.denyOut } : undefined,
      });
    return c.body(null, 204);
  });

  app.get("/sandboxes/:sandboxID/metrics", async (c) => {
    const sb = visible(c);
    return c.json(await sandboxMetrics(s, sb));
  });

  return app;
}

/**
 * Moves the deadline to `ms` from now unless it is later already. A sandbox with none keeps none
 * (one made through forkd's own API), unless E2B's API made it (its deadline went with a pause).
 */
async function extend(s: E2bServices, sb: ReadonlySandbox, ms: number): Promise<void> {
  const none = sb.record.deadline === null || sb.record.deadline === undefined;
  if (none && !sb.record.e2b) return;
  if (!none && endAtOf(sb) >= Date.now() + ms) return;
  await s.sandboxes.setDeadline(sb.record.id, ms);
}
