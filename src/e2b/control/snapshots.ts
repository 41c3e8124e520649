/**
 * E2B's snapshots over forkd's: create (POST /sandboxes/{id}/snapshots: a branch of the running
 * sandbox, tagged with the name given or `snap-<random>`; the sandbox keeps running), list
 * (GET /snapshots: the caller's snapshots branched from sandboxes, by tag, paginated like
 * sandboxes) and delete (DELETE /templates/{id}, refused while sandboxes run from it). A
 * snapshot's id is its tag, which POST /sandboxes takes as templateID.
 */
import { randomBytes } from "node:crypto";
import { Hono } from "hono";
import { isAdmin } from "../../access/index.js";
import type { Caller } from "../../access/index.js";
import { branchAs } from "../../app/index.js";
import { FORK_TAG_PREFIX } from "../../app/index.js";
import { liveSandbox, noSnapshot, tagNames } from "../../app/index.js";
import { deleteSnapshotAs, snapshotsOf } from "../../app/index.js";
import { splitKey } from "../../snapshot/index.js";
import type { E2bServices } from "../context.js";
import { ADMIN_ONLY_OWNER } from "../../sandbox/index.js";
import { ForkdError } from "../../util/index.js";
import { TAG_RE, isValidKey } from "../../util/index.js";
import type { E2bEnv } from "./env.js";
import { noteE2bTarget } from "./env.js";
import { readJson, readQuery } from "./parse.js";
import { SnapshotBody, SnapshotListQuery } from "./schemas.js";

/** E2B lists the caller's own: a tenant's, or for an admin those of admins (shared or private). */
const ownedBy = (owner: string | null | undefined, caller: Caller): boolean =>
  isAdmin(caller) ? (owner ?? null) === null || owner === ADMIN_ONLY_OWNER : owner === caller.tenant;

export function snapshotRoutes(s: E2bServices): Hono<E2bEnv> {
  const app = new Hono<E2bEnv>();

  app.post("/sandboxes/:sandboxID/snapshots", async (c) => {
    const b = await readJson(c, SnapshotBody, s.limits.body.json);
    const caller = c.get("caller");
    const sb = liveSandbox(s, caller, c.req.param("sandboxID"));
    noteE2bTarget(c, "sandbox", sb.record.id);
    const tag = b.name ?? `snap-${randomBytes(6).toString("hex")}`;
    if (!isValidKey(tag) || splitKey(tag).name.startsWith(FORK_TAG_PREFIX))
      throw new ForkdError(
        "invalid_argument",
        `name must match ${TAG_RE.source} (and not start with ${FORK_TAG_PREFIX})`,
      );
    if (sb.state !== "running")
      throw new ForkdError(
        "conflict",
        `sandbox ${sb.record.id} is paused: only a running sandbox is snapshotted`,
      );
    noteE2bTarget(c, "snapshot", tag);
    // In its sandbox's tenant's namespace (a taken or reserved name refused as on forkd's API);
    // an admin's is the admins' alone: a snapshot of E2B's is its team's, never shared.
    const r = await branchAs(s, caller, sb.record.id, tag, { wait: true, private: true });
    const name = tagNames(caller)(r.tag);
    return c.json({ snapshotID: name, names: [name] }, 201);
  });

  app.get("/snapshots", async (c) => {
    const q = readQuery(c, SnapshotListQuery);
    const caller = c.get("caller");
    const name = q.name?.replace(/:default$/, "");
    const names = tagNames(caller);
    const all = (await snapshotsOf(s, caller)).snapshots
      .filter((m) => m.branch !== undefined && !splitKey(m.tag).name.startsWith(FORK_TAG_PREFIX))
      .filter((m) => ownedBy(m.owner, caller))
      .filter((m) => q.sandboxID === undefined || m.branch?.sandbox === q.sandboxID)
      .map((m) => names(m.tag))
      .filter((t) => name === undefined || t === name)
      .sort();
    const from = q.nextToken ? all.findIndex((t) => t > q.nextToken!) : 0;
    const start = from < 0 ? all.length : from;
    const page = all.slice(start, start + (q.limit ?? 100));
    const last = page[page.length - 1];
    if (last !== undefined && start + page.length < all.length) c.header("X-Next-Token", last);
    return c.json(page.map((tag) => ({ snapshotID: tag, names: [tag] })));
  });

  app.delete("/templates/:templateID", async (c) => {
    const tag = c.req.param("templateID").replace(/:default$/, "");
    noteE2bTarget(c, "snapshot", tag);
    if (!isValidKey(tag)) throw noSnapshot(tag);
    const caller = c.get("caller");
    // A reserved name (a tenant's), a shared snapshot: forbidden; one it cannot see: not found.
    await deleteSnapshotAs(s, caller, tag, { cascade: false, force: false });
    return c.body(null, 204);
  });

  return app;
}
