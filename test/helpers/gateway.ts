/**
 * A gateway for tests (src/gateway/): started over a Kv (a fake etcd or a real member) with a
 * fixed map of bearer tokens, its REST and E2B listeners on loopback ports, quick bounds. close()
 * stops it (listeners, its view, its lease); kill() drops its listeners' connections at once, as
 * a gateway killed with -9 (etcd then expires its lease).
 */
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { randomBytes } from "node:crypto";
import type { SecureContext } from "node:tls";
import type { Caller } from "../../src/access/caller.js";
import { SealedSessions } from "../../src/access/sealed-sessions.js";
import { AuthFailureLimiter } from "../../src/access/auth-failures.js";
import type { ClusterKeys } from "../../src/cluster/keys.js";
import type { Kv } from "../../src/etcd/kv.js";
import { ADMITTED_PURPOSE, ClusterSecret } from "../../src/access/cluster-secret.js";
import { startGateway } from "../../src/gateway/gateway.js";
import type { RunningGateway } from "../../src/gateway/gateway.js";
import type { GatewayBounds } from "../../src/gateway/context.js";

export interface TestGateway {
  running: RunningGateway;
  url: string;
  e2bUrl: string;
  close(): Promise<void>;
  kill(): void;
}

export const SILENT = { info: () => undefined, warn: () => undefined };

/** A token map's authenticate(): the shape the gateway asks of the cluster's token store. */
export const mapAuth = (tokens: ReadonlyMap<string, Caller>) => ({
  authenticate(header: string | undefined): Caller | null {
    const m = /^Bearer (\S+)$/.exec(header ?? "");
    return m?.[1] ? (tokens.get(m[1]) ?? null) : null;
  },
  fresh: async (): Promise<void> => undefined,
});

export const tenant = (name: string, maxSandboxes: number | null = null): Caller => ({
  name,
  tenant: name,
  tokenId: `tok-${name.padEnd(12, "a").slice(0, 12)}`,
  limited: true,
  maxSandboxes,
});

export const ADMIN: Caller = {
  name: "admin",
  tenant: null,
  tokenId: null,
  limited: true,
  maxSandboxes: null,
};

export async function startTestGateway(o: {
  kv: Kv;
  keys: ClusterKeys;
  tokens: ReadonlyMap<string, Caller>;
  secret?: Buffer;
  bounds?: Partial<GatewayBounds>;
  sweepMs?: number;
  consoleDist?: string | null;
  /** The CAs https nodes' certificates must chain to, besides Node's (FORKD_NODE_CA_FILE's). */
  nodeTrust?: SecureContext | null;
}): Promise<TestGateway> {
  const secret = o.secret ?? randomBytes(32);
  const running = await startGateway({
    kv: o.kv,
    keys: o.keys,
    auth: mapAuth(o.tokens),
    sessions: new SealedSessions(secret),
    admitted: ClusterSecret.of(secret).bearer(ADMITTED_PURPOSE),
    log: SILENT,
    version: "test",
    consoleDist: o.consoleDist ?? null,
    bounds: { connectMs: 1_000, replyMs: 5_000, forkMs: 5_000, listMs: 2_000, upgradeMs: 5_000, ...o.bounds },
    authFailures: new AuthFailureLimiter({ rps: 0, burst: 1 }),
    sweepMs: o.sweepMs ?? 60_000,
    nodeTrust: o.nodeTrust ?? null,
  });
  const sockets = new Set<Socket>();
  const listen = async (s: Server): Promise<string> => {
    s.on("connection", (c: Socket) => {
      sockets.add(c);
      c.on("close", () => sockets.delete(c));
    });
    await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
    return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
  };
  const rest = createServer(running.rest);
  rest.on("upgrade", running.restUpgrade);
  const e2b = createServer(running.e2b);
  e2b.on("upgrade", running.e2bUpgrade);
  const url = await listen(rest);
  const e2bUrl = await listen(e2b);
  let closed = false;
  const stopListening = () => {
    for (const s of sockets) s.destroy();
    rest.close();
    e2b.close();
  };
  return {
    running,
    url,
    e2bUrl,
    kill() {
      closed = true;
      stopListening();
      void running.close();
    },
    async close() {
      if (closed) return;
      closed = true;
      stopListening();
      await running.close();
    },
  };
}

/** A JSON call (fetch) with a bearer token; the status, headers and parsed body (typed by the caller). */
export async function call<T = Record<string, unknown>>(
  url: string,
  method: string,
  path: string,
  o: { token?: string; body?: unknown; headers?: Record<string, string> } = {},
): Promise<{ status: number; headers: Headers; body: T }> {
  const r = await fetch(url + path, {
    method,
    headers: {
      ...(o.token ? { authorization: `Bearer ${o.token}` } : {}),
      ...(o.body !== undefined ? { "content-type": "application/json" } : {}),
      ...o.headers,
    },
    ...(o.body !== undefined ? { body: JSON.stringify(o.body) } : {}),
  });
  const text = await r.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: r.status, headers: r.headers, body: body as T };
}

/** Tokens of the tests' callers: an admin, alice (limit 5), bob. */
export const TOKENS: ReadonlyMap<string, Caller> = new Map([
  ["admin-token", ADMIN],
  ["alice-token", tenant("alice", 5)],
  ["bob-token", tenant("bob")],
]);
