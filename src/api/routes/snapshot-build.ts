/** The route building a snapshot from a Dockerfile: the build context is the body (a tar), the options the query. */
import { Hono } from "hono";
import { ForkdError } from "../../util/errors.js";
import type { Services } from "../services.js";
import { BuildSnapshotQuery } from "../contract/schemas.js";
import { bodyStream, parseQuery } from "../parse.js";
import { noteTarget } from "../env.js";
import type { ApiEnv } from "../env.js";
import { hangupSignal, progressStream } from "../stream.js";
import { snapshotView } from "../views/snapshot.js";

function buildArgs(raw: string | undefined): Record<string, string> {
  if (raw === undefined) return {};
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    throw new ForkdError("invalid_argument", "build_args must be a JSON object of strings", {
      field: "build_args",
    });
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new ForkdError("invalid_argument", "build_args must be a JSON object of strings", {
      field: "build_args",
    });
  }
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(v)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) || typeof x !== "string") {
      throw new ForkdError(
        "invalid_argument",
        `build_args: ${JSON.stringify(k)} must be a name with a string value`,
        {
          field: "build_args",
        },
      );
    }
    out[k] = x;
  }
  return out;
}

export function snapshotBuildRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  // ?stream=1: NDJSON progress lines (each RUN step's output among them), then {"type":"done",
  // "snapshot"} or {"type":"error","error"}; otherwise one JSON reply when ready.
  app.post("/build", async (c) => {
    const q = parseQuery(c, BuildSnapshotQuery);
    const body = bodyStream(c);
    if (!body) throw new ForkdError("invalid_argument", "the request body must be the build context (a tar)");
    const req = {
      tag: q.tag,
      dockerfile: q.dockerfile,
      buildArgs: buildArgs(q.build_args),
      memoryMiB: q.memory_mib,
      vcpus: q.vcpus,
      warm: q.warm ?? null,
      warmEval: q.warm_eval ?? null,
      warmEvalLanguage: q.warm_eval_language,
      owner: c.get("caller").tenant,
    };
    noteTarget(c, "snapshot", q.tag);
    // A client that hangs up before the snapshot is published cancels the build (snapshots.ts).
    if (q.stream !== "1") {
      return c.json(
        snapshotView(await s.snapshots.createFromDockerfile({ ...req, signal: hangupSignal(c) }, body)),
        201,
      );
    }
    if (await s.snapshots.has(q.tag))
      throw new ForkdError("conflict", `snapshot ${q.tag} already exists`, { tag: q.tag });
    return progressStream(
      c,
      201,
      "snapshot",
      `snapshot ${q.tag}`,
      s.log,
      async (progress, watcher) =>
        snapshotView(
          await s.snapshots.createFromDockerfile({ ...req, signal: watcher.signal }, body, progress),
        ),
      "cancel",
    );
  });

  return app;
}
