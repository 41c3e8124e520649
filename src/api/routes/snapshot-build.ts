/** The route building a snapshot from a Dockerfile: the build context is the body (a tar), the options the query. */
import { Hono } from "hono";
import { buildCapsOf, checkBuildSize } from "../../access/index.js";
import { ForkdError } from "../../util/index.js";
import type { Services } from "../../app/index.js";
import { BuildSnapshotQuery } from "../contract/schemas.js";
import { bodyStream, parseQuery } from "../parse.js";
import { noteTarget } from "../env.js";
import type { ApiEnv } from "../env.js";
import { creationReply } from "../stream.js";
import { snapshotView } from "../views/snapshot.js";
import { newSnapshotKey, tagNames } from "../../app/index.js";

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
    // A tenant's build is held to its caps (403 naming the one it is over) before anything runs.
    const caps = buildCapsOf(c.get("caller"), s.limits.buildCaps);
    checkBuildSize(caps, { memoryMiB: q.memory_mib, vcpus: q.vcpus });
    const body = bodyStream(c);
    if (!body) throw new ForkdError("invalid_argument", "the request body must be the build context (a tar)");
    const caller = c.get("caller");
    const names = tagNames(caller);
    noteTarget(c, "snapshot", q.tag);
    // Resolved (and a taken or reserved tag refused) before the context is read.
    const { key, owner } = await newSnapshotKey(s, caller, q.tag);
    const req = {
      tag: key,
      dockerfile: q.dockerfile,
      buildArgs: buildArgs(q.build_args),
      memoryMiB: q.memory_mib,
      vcpus: q.vcpus,
      warm: q.warm ?? null,
      warmEval: q.warm_eval ?? null,
      warmEvalLanguage: q.warm_eval_language,
      owner,
      maxDiskMiB: caps?.buildDiskMiB ?? null,
    };
    // A client that hangs up before the snapshot is published cancels the build.
    return creationReply(
      c,
      q.stream === "1",
      "snapshot",
      `snapshot ${key}`,
      s.log,
      async (signal, progress) =>
        snapshotView(await s.snapshots.createFromDockerfile({ ...req, signal }, body, progress), names),
    );
  });

  return app;
}
