/**
 * What every envd call is given: the daemon's services, the envd state shared by its calls
 * (watchers, accounts, what callers opened; its processes are the sandbox's commands), and per
 * request the sandbox it targets, its owner and the call's credential (Connect context values set by the handler from the
 * sandbox plane's routing and authorization).
 */
import { createContextKey } from "@connectrpc/connect";
import type { HandlerContext } from "@connectrpc/connect";
import { OpenStreams } from "../../access/index.js";
import type { E2bServices } from "../context.js";
import type { Lease } from "../../sandbox/index.js";
import { ForkdError } from "../../util/index.js";
import type { Account } from "./accounts.js";
import { Accounts, requestedUser, resolvePath } from "./accounts.js";
import { toConnectError } from "./errors.js";
import { Watchers } from "./watchers.js";

export interface EnvdState {
  s: E2bServices;
  watchers: Watchers;
  accounts: Accounts;
  /** What callers opened, by credential: a polling watcher is removed when its maker's is revoked. */
  opened: OpenStreams;
  /** How long an upload may send nothing before it is ended (files-http.ts; tests shorten it). */
  bodyIdleMs?: number;
}

export function envdState(s: E2bServices): EnvdState {
  return {
    s,
    watchers: new Watchers(),
    accounts: new Accounts(),
    opened: s.e2b?.auth.tokens.opened ?? new OpenStreams(),
  };
}

/** The sandbox a Connect call targets (set by handler.ts). */
export const SANDBOX_ID = createContextKey<string>("", { description: "envd: the target sandbox" });

/** Whose the target sandbox is, and the credential the call came by (set by handler.ts). */
export interface CallAccess {
  owner: string | null;
  credential: string | undefined;
}
export const CALL_ACCESS = createContextKey<CallAccess>(
  { owner: null, credential: undefined },
  { description: "envd: the target sandbox's owner and the call's credential" },
);

export function sandboxOf(ctx: HandlerContext): string {
  const id = ctx.values.get(SANDBOX_ID);
  if (!id) throw new ForkdError("internal", "envd call without a sandbox");
  return id;
}

/** Default and bounds of the keepalive interval (the SDK asks 50 s: Keepalive-Ping-Interval). */
export function keepaliveMs(ctx: HandlerContext): number {
  const s = Number(ctx.requestHeader.get("keepalive-ping-interval") ?? "50");
  return Math.min(Math.max(Number.isFinite(s) ? s : 50, 1), 600) * 1000;
}

/** A call's lease on its sandbox and the account it acts as (released on failure). */
export async function leaseAs(
  st: EnvdState,
  ctx: HandlerContext,
): Promise<{ lease: Lease; account: Account }> {
  const id = sandboxOf(ctx);
  const user = requestedUser(ctx.requestHeader.get("authorization") ?? undefined);
  const lease = st.s.sandboxes.lease(id);
  try {
    return { lease, account: await st.accounts.resolve(id, lease.agent, user) };
  } catch (e) {
    lease.release();
    throw await lease.explain(e);
  }
}

/** Runs `fn` with the call's lease and account; errors become Connect errors. */
export async function withLease<T>(
  st: EnvdState,
  ctx: HandlerContext,
  fn: (lease: Lease, account: Account, resolve: (p: string) => string) => Promise<T>,
): Promise<T> {
  try {
    const { lease, account } = await leaseAs(st, ctx);
    try {
      return await fn(lease, account, (p) => resolvePath(p, account));
    } catch (e) {
      throw await lease.explain(e);
    } finally {
      lease.release();
    }
  } catch (e) {
    throw toConnectError(e);
  }
}
