/**
 * envd's filesystem service (filesystem.Filesystem) over a sandbox's guest agent: Stat,
 * ListDir (with depth), MakeDir, Move, Remove, WatchDir (streamed) and the polling watchers.
 * Paths resolve against the user's home; everything is done as that user: what is listed,
 * made, moved, removed or watched is seen and checked with its permissions, and made its own.
 */
import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { ForkdError } from "../../util/index.js";
import type { EnvdState } from "./context.js";
import { CALL_ACCESS, keepaliveMs, leaseAs, sandboxOf, withLease } from "./context.js";
import { findEntries, statEntry } from "./entry-info.js";
import { agentUser, resolvePath } from "./accounts.js";
import { toConnectError } from "./errors.js";
import { helperSh } from "./helper-env.js";
import { EventQueue } from "./event-queue.js";
import { WatchDirResponseSchema } from "./gen/filesystem/filesystem_pb.js";
import type { FilesystemEvent, WatchDirResponse, Filesystem } from "./gen/filesystem/filesystem_pb.js";
import { startWatch } from "./watch-events.js";

type FilesystemImpl = ServiceImpl<typeof Filesystem>;

/** ListDir's deepest listing. */
const MAX_DEPTH = 64;

const requirePath = (p: string): string => {
  if (p === "") throw new ForkdError("invalid_argument", "path is required");
  return p;
};

export function filesystemService(st: EnvdState): FilesystemImpl {
  return {
    async stat(req, ctx) {
      return withLease(st, ctx, async (l, a, resolve) => ({
        entry: await statEntry(l.agent, a.name, resolve(requirePath(req.path))),
      }));
    },

    async listDir(req, ctx) {
      return withLease(st, ctx, async (l, a, resolve) => {
        const depth = req.depth === 0 ? 1 : req.depth;
        if (depth > MAX_DEPTH) throw new ForkdError("invalid_argument", `depth is at most ${MAX_DEPTH}`);
        const dir = resolve(req.path === "" ? "." : req.path);
        const found = await findEntries(l.agent, a.name, dir, depth);
        if (found[0]?.typeChar !== "d")
          throw new ForkdError("invalid_argument", `path ${dir} is not a directory`);
        return { entries: found.slice(1).map((f) => f.entry) };
      });
    },

    async makeDir(req, ctx) {
      return withLease(st, ctx, async (l, a, resolve) => {
        const path = resolve(requirePath(req.path));
        const user = (await agentUser(l.agent, a)) ?? undefined;
        const existing = await l.agent.stat(path, undefined, user).catch((e: unknown) => {
          if (e instanceof ForkdError && e.code === "not_found") return null;
          throw e;
        });
        if (existing?.type === "dir")
          throw new ForkdError("conflict", `directory ${path} already exists`, { errno_name: "EEXIST" });
        if (existing) throw new ForkdError("invalid_argument", `path ${path} exists and is not a directory`);
        const [f] = await findEntries(l.agent, a.name, path, 0, ['mkdir -p -- "$1"']);
        return { entry: f!.entry };
      });
    },

    async move(req, ctx) {
      return withLease(st, ctx, async (l, a, resolve) => {
        const from = resolve(requirePath(req.source));
        const to = resolve(requirePath(req.destination));
        const user = await agentUser(l.agent, a);
        if (user === null) await helperSh(l.agent, a.name, 'exec mv -T -- "$1" "$2"', [from, to]);
        else await l.agent.rename(from, to, undefined, user);
        return { entry: await statEntry(l.agent, a.name, to) };
      });
    },

    async remove(req, ctx) {
      return withLease(st, ctx, async (l, a, resolve) => {
        const path = resolve(requirePath(req.path));
        const user = await agentUser(l.agent, a);
        if (user === null)
          await helperSh(
            l.agent,
            a.name,
            '[ -e "$1" ] || [ -L "$1" ] || { echo "$1: No such file or directory" >&2; exit 1; }; exec rm -rf -- "$1"',
            [path],
          );
        else await l.agent.remove(path, { recursive: true, user });
        return {};
      });
    },

    async *watchDir(req, ctx) {
      let leased: Awaited<ReturnType<typeof leaseAs>>;
      try {
        leased = await leaseAs(st, ctx);
      } catch (e) {
        throw toConnectError(e);
      }
      const { lease, account } = leased;
      const q = new EventQueue<FilesystemEvent>(4 << 20);
      let handle: Awaited<ReturnType<typeof startWatch>> | null = null;
      try {
        const dir = resolvePath(requirePath(req.path), account);
        handle = await startWatch(
          lease.agent,
          {
            dir,
            recursive: req.recursive,
            includeEntry: req.includeEntry,
            user: account.name,
            agentUser: (await agentUser(lease.agent, account)) ?? undefined,
          },
          (e) => (q.push(e, 64 + e.name.length) ? undefined : q.room()),
        );
        handle.done.then(
          () => q.close(),
          (e: unknown) => q.close(e),
        );
        yield start();
        const every = keepaliveMs(ctx);
        for (;;) {
          const n = await q.next(every, ctx.signal);
          if (n === null) return;
          yield "keepalive" in n ? keepalive() : filesystem(n.event);
        }
      } catch (e) {
        throw toConnectError(await lease.explain(e));
      } finally {
        handle?.stop();
        q.abandon();
        lease.release();
      }
    },

    async createWatcher(req, ctx) {
      let leased: Awaited<ReturnType<typeof leaseAs>>;
      try {
        leased = await leaseAs(st, ctx);
      } catch (e) {
        throw toConnectError(e);
      }
      const { lease, account } = leased;
      const id = sandboxOf(ctx);
      const access = ctx.values.get(CALL_ACCESS);
      let w: ReturnType<EnvdState["watchers"]["reserve"]>;
      // Removed (its lease released) when it is, or when the credential that made it is revoked.
      let unregister = (): void => undefined;
      try {
        w = st.watchers.reserve(id, access.owner, () => {
          unregister();
          lease.release();
        });
      } catch (e) {
        lease.release();
        throw toConnectError(e);
      }
      const watcherId = w.id;
      unregister = st.opened.open(access.credential, () => {
        try {
          st.watchers.remove(id, watcherId);
        } catch {
          /* already removed */
        }
      });
      try {
        const dir = resolvePath(requirePath(req.path), account);
        const h = await startWatch(
          lease.agent,
          {
            dir,
            recursive: req.recursive,
            includeEntry: req.includeEntry,
            user: account.name,
            agentUser: (await agentUser(lease.agent, account)) ?? undefined,
          },
          (e) => w.push(e),
        );
        st.watchers.started(w.id, h);
        return { watcherId: w.id };
      } catch (e) {
        st.watchers.remove(id, w.id);
        throw toConnectError(await lease.explain(e));
      }
    },

    async getWatcherEvents(req, ctx) {
      try {
        return { events: st.watchers.take(sandboxOf(ctx), req.watcherId) };
      } catch (e) {
        throw toConnectError(e);
      }
    },

    async removeWatcher(req, ctx) {
      try {
        st.watchers.remove(sandboxOf(ctx), req.watcherId);
        return {};
      } catch (e) {
        throw toConnectError(e);
      }
    },
  };
}

const start = (): WatchDirResponse => create(WatchDirResponseSchema, { event: { case: "start", value: {} } });
const keepalive = (): WatchDirResponse =>
  create(WatchDirResponseSchema, { event: { case: "keepalive", value: {} } });
const filesystem = (e: FilesystemEvent): WatchDirResponse =>
  create(WatchDirResponseSchema, { event: { case: "filesystem", value: e } });
