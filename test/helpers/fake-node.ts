/**
 * A fake forkd node for the gateway's tests: two small HTTP servers (its REST and E2B
 * listeners) that register in etcd as a node does (src/cluster/records.ts: nodes/<id> under a
 * lease, holdings/, sandboxes/<id> with by-node/ and by-owner/ before a fork answers) and answer
 * what a gateway relays: forks (children made up with the REST API's whole view, records
 * written), listings, an event stream,
 * an NDJSON exec stream, a terminal WebSocket (echo), E2B's create, list and sandbox plane; any
 * other call to a sandbox is echoed back. Bearer tokens are checked against a fixed map, as the
 * gateway's are. Every request is recorded (method, path, headers, body), so a test asserts what
 * a node received. `hang` holds requests unanswered; `kill()` drops every connection at once and
 * stops the node's lease from being kept (its keys go when it expires, or at once on a fake
 * etcd), as a node killed with -9. With `tls` its listeners serve https (its addresses are
 * https://), as a node with FORKD_TLS_CERT/FORKD_TLS_KEY.
 */
import { createServer as createHttpServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { WebSocketServer } from "ws";
import type { Caller } from "../../src/access/caller.js";
import type { ClusterKeys } from "../../src/cluster/keys.js";
import type { CatalogEntry, MachineKind, NodeRecord, SandboxLocation } from "../../src/cluster/records.js";
import type { Kv, KvLease } from "../../src/etcd/kv.js";
import { recordView } from "../../src/gateway/record-view.js";
import { newSandboxId } from "../../src/util/ids.js";

export const MACHINE: MachineKind = { accel: "tcg", qemu: "8.2.2", cpu: "max" };

export interface Seen {
  door: "rest" | "e2b";
  method: string;
  path: string;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

export interface FakeNodeOptions {
  id: string;
  kv: Kv;
  keys: ClusterKeys;
  tokens: ReadonlyMap<string, Caller>;
  maxSandboxes?: number;
  machine?: MachineKind;
  /** Lease TTL, seconds (default 6). */
  ttl?: number;
  /** Snapshots it holds (key → warm members). */
  holds?: Record<string, number>;
  e2b?: boolean;
  /** Called by kill() with the node's lease id: a fake etcd expires it; a real one waits the TTL. */
  onKill?: (leaseId: string) => Promise<void>;
  /** Its listeners serve https with this PEM certificate and key (default: http). */
  tls?: { cert: string | Buffer; key: string | Buffer };
}

interface Child {
  view: Record<string, unknown>;
  owner: string | null;
}

export class FakeNode {
  readonly seen: Seen[] = [];
  readonly children = new Map<string, Child>();
  /** Requests are held unanswered while true. */
  hang = false;
  /** The last `failLast` children of each fork fail (vmm_error). */
  failLast = 0;
  /** Its record is not rewritten after a fork while true (a node whose rewrite lags). */
  recordLags = false;
  /** Its record says it drains (written by the next publish()). */
  draining = false;
  private readonly sockets = new Set<Socket>();
  /** Connections its listeners accepted so far. */
  connections = 0;
  private lease: KvLease | null = null;
  private rest!: Server;
  private e2bServer: Server | null = null;
  api = "";
  e2b: string | null = null;
  private readonly wss = new WebSocketServer({ noServer: true });
  /** Open event streams: a `sandbox` event is written to each on a fork. */
  private readonly streams = new Set<ServerResponse>();

  constructor(readonly o: FakeNodeOptions) {}

  static async start(o: FakeNodeOptions): Promise<FakeNode> {
    const n = new FakeNode(o);
    await n.listen();
    await n.register();
    return n;
  }

  private async listen(): Promise<void> {
    const serve = (door: "rest" | "e2b") => (req: IncomingMessage, res: ServerResponse) => {
      const parts: Buffer[] = [];
      req.on("data", (c: Buffer) => parts.push(c));
      req.on("end", () => {
        const body = Buffer.concat(parts).toString("utf8");
        this.seen.push({
          door,
          method: req.method ?? "",
          path: req.url ?? "",
          headers: { ...req.headers },
          body,
        });
        if (this.hang) return; // held: the gateway's bound must end it
        try {
          if (door === "rest") void this.restCall(req, res, body);
          else void this.e2bCall(req, res, body);
        } catch {
          res.destroy();
        }
      });
    };
    const tls = this.o.tls;
    const createServer = (h: (req: IncomingMessage, res: ServerResponse) => void): Server =>
      tls ? createHttpsServer({ cert: tls.cert, key: tls.key }, h) : createHttpServer(h);
    const scheme = tls ? "https" : "http";
    // Over TLS too a connection is its TCP socket (counted, and killed by kill()).
    const track = (s: Server) =>
      s.on("connection", (sock: Socket) => {
        this.connections++;
        this.sockets.add(sock);
        sock.on("close", () => this.sockets.delete(sock));
      });
    this.rest = track(createServer(serve("rest")));
    this.rest.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
      this.seen.push({
        door: "rest",
        method: "UPGRADE",
        path: req.url ?? "",
        headers: { ...req.headers },
        body: "",
      });
      if (!this.caller(req)) {
        socket.end("HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
      }
      this.wss.handleUpgrade(req, socket, head, (ws) => {
        ws.on("message", (m: Buffer, binary: boolean) =>
          ws.send(binary ? m : `${this.o.id}:${m.toString()}`),
        );
      });
    });
    await new Promise<void>((r) => this.rest.listen(0, "127.0.0.1", () => r()));
    this.api = `${scheme}://127.0.0.1:${(this.rest.address() as AddressInfo).port}`;
    if (this.o.e2b !== false) {
      this.e2bServer = track(createServer(serve("e2b")));
      await new Promise<void>((r) => this.e2bServer?.listen(0, "127.0.0.1", () => r()));
      this.e2b = `${scheme}://127.0.0.1:${(this.e2bServer.address() as AddressInfo).port}`;
    }
  }

  private caller(req: IncomingMessage): Caller | null {
    const key = req.headers["x-api-key"];
    const auth = typeof key === "string" ? `Bearer ${key}` : req.headers.authorization;
    const m = /^Bearer (\S+)$/.exec(auth ?? "");
    return m?.[1] ? (this.o.tokens.get(m[1]) ?? null) : null;
  }

  record(): NodeRecord {
    const running = [...this.children.values()].filter((c) => c.view.state === "running").length;
    const now = new Date().toISOString();
    return {
      id: this.o.id,
      api: this.api,
      e2b: this.e2b,
      version: "test",
      started: now,
      lease: this.lease?.id ?? "0",
      machine: this.o.machine ?? MACHINE,
      capacity: {
        cores: 2,
        memoryMiB: 4096,
        maxSandboxes: this.o.maxSandboxes ?? 20,
        running,
        paused: 0,
        freeMemoryMiB: 2048,
      },
      draining: this.draining,
      updated: now,
    };
  }

  async register(): Promise<void> {
    this.lease = await this.o.kv.grantLease(this.o.ttl ?? 6);
    await this.publish();
    for (const [key, warm] of Object.entries(this.o.holds ?? {}))
      await this.o.kv.put(
        this.o.keys.holding(this.o.id, key),
        JSON.stringify({ key, digest: "a".repeat(64), warm }),
        this.lease.id,
      );
  }

  async publish(): Promise<void> {
    if (!this.lease) return;
    await this.o.kv.put(this.o.keys.node(this.o.id), JSON.stringify(this.record()), this.lease.id);
  }

  private send(
    res: ServerResponse,
    status: number,
    body: unknown,
    headers: Record<string, string> = {},
  ): void {
    const text = JSON.stringify(body);
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(text);
  }

  /** Makes `n` children of `tag` for `owner`, writing their records as a node does. */
  private async makeChildren(
    tag: string,
    n: number,
    owner: string | null,
  ): Promise<Record<string, unknown>[]> {
    const out: Record<string, unknown>[] = [];
    for (let i = 0; i < n; i++) {
      const id = newSandboxId();
      const created = new Date().toISOString();
      const loc: SandboxLocation = {
        id,
        node: this.o.id,
        owner,
        tag,
        state: "running",
        reason: null,
        created,
        updated: created,
      };
      // The REST API's whole Sandbox view (what a console renders), as its record gives it.
      const view = { ...recordView(loc, (k) => k), pid: 4242 };
      await this.o.kv.txn(
        [],
        [
          { type: "put", key: this.o.keys.sandbox(id), value: JSON.stringify(loc) },
          { type: "put", key: this.o.keys.byNodeEntry(this.o.id, id), value: "" },
          ...(owner !== null
            ? [{ type: "put" as const, key: this.o.keys.byOwnerEntry(owner, id), value: "" }]
            : []),
        ],
      );
      this.children.set(id, { view, owner });
      out.push(view);
      for (const s of this.streams) s.write(`event: sandbox\ndata: ${JSON.stringify(view)}\n\n`);
    }
    if (!this.recordLags) await this.publish();
    return out;
  }

  private visible(c: Caller): Record<string, unknown>[] {
    return [...this.children.values()]
      .filter((ch) => c.tenant === null || ch.owner === c.tenant)
      .map((ch) => ch.view)
      .sort((a, b) => {
        const x = `${String(a.created)}|${String(a.id)}`;
        const y = `${String(b.created)}|${String(b.id)}`;
        return x < y ? -1 : x > y ? 1 : 0;
      });
  }

  private async restCall(req: IncomingMessage, res: ServerResponse, body: string): Promise<void> {
    const c = this.caller(req);
    if (!c)
      return this.send(res, 401, { error: { code: "unauthenticated", message: "wrong token", details: {} } });
    const url = new URL(req.url ?? "/", "http://node");
    const path = url.pathname;
    if (req.method === "POST" && path === "/v1/sandboxes") {
      const b = JSON.parse(body) as { snapshot_tag: string; n?: number };
      const n = b.n ?? 1;
      const ok = Math.max(0, n - this.failLast);
      const sandboxes = await this.makeChildren(b.snapshot_tag, ok, c.tenant);
      const failures = Array.from({ length: n - ok }, (_, i) => ({
        index: ok + i,
        code: "vmm_error",
        message: "the VMM exited",
      }));
      if (sandboxes.length === 0)
        return this.send(res, 500, {
          error: { code: "vmm_error", message: "every child failed: the VMM exited", details: { failures } },
        });
      return this.send(res, 201, { sandboxes, failures });
    }
    if (req.method === "GET" && path === "/v1/sandboxes") {
      const all = this.visible(c);
      const limit = url.searchParams.get("limit");
      const after = url.searchParams.get("next_token");
      const key = (v: Record<string, unknown>) => `${String(v.created)}|${String(v.id)}`;
      const from = after ? Buffer.from(after, "base64url").toString("utf8") : "";
      const rest = all.filter((v) => key(v) > from);
      const page = limit ? rest.slice(0, Number(limit)) : rest;
      const last = page[page.length - 1];
      const more = page.length < rest.length && last;
      return this.send(res, 200, {
        sandboxes: page,
        next_token: more ? Buffer.from(key(last), "utf8").toString("base64url") : null,
      });
    }
    if (req.method === "GET" && path === "/v1/events") {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(
        `event: state\ndata: ${JSON.stringify({ sandboxes: this.visible(c), snapshots: [], pending: [] })}\n\n`,
      );
      this.streams.add(res);
      res.on("close", () => this.streams.delete(res));
      return;
    }
    if (req.method === "GET" && path === "/v1/snapshots")
      return this.send(res, 200, {
        snapshots: [],
        pending: [{ tag: `writing-on-${this.o.id}`, status: "writing" }],
      });
    const snap = /^\/v1\/snapshots\/([^/]+)$/.exec(path);
    if (req.method === "GET" && snap)
      return snap[1] === `writing-on-${this.o.id}`
        ? this.send(res, 200, { tag: snap[1], status: "writing" })
        : this.send(res, 404, {
            error: { code: "not_found", message: `no snapshot tagged ${snap[1]}`, details: {} },
          });
    const sb = /^\/v1\/sandboxes\/(sb-[a-z2-7]{16})(\/.*)?$/.exec(path);
    if (sb && sb[2] === "/exec/stream") {
      // NDJSON lines every 30 ms: `lines` of them, the node dying after `die_after` if given.
      const b = JSON.parse(body || "{}") as { lines?: number; die_after?: number };
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      let i = 0;
      const t = setInterval(() => {
        if (b.die_after !== undefined && i >= b.die_after) {
          clearInterval(t);
          this.kill();
          return;
        }
        if (i >= (b.lines ?? 5)) {
          clearInterval(t);
          res.end(JSON.stringify({ type: "exit", exit_code: 0 }) + "\n");
          return;
        }
        res.write(JSON.stringify({ type: "stdout", data: `line ${i++} from ${this.o.id}` }) + "\n");
      }, 30);
      res.on("close", () => clearInterval(t));
      return;
    }
    if (sb && sb[2] === "/hang") return; // never answered
    return this.send(res, 200, {
      node: this.o.id,
      method: req.method,
      path: req.url,
      authorization: req.headers.authorization ?? null,
      body,
    });
  }

  private async e2bCall(req: IncomingMessage, res: ServerResponse, body: string): Promise<void> {
    if (req.headers["e2b-sandbox-id"] !== undefined || /^\d+-sb-/.test(req.headers.host ?? ""))
      return this.send(res, 200, {
        node: this.o.id,
        plane: true,
        path: req.url,
        accessToken: req.headers["x-access-token"] ?? null,
        sandboxId: req.headers["e2b-sandbox-id"] ?? null,
        host: req.headers.host ?? null,
      });
    const c = this.caller(req);
    if (!c) return this.send(res, 401, { code: 401, message: "invalid API key" });
    const url = new URL(req.url ?? "/", "http://node");
    if (req.method === "POST" && (url.pathname === "/sandboxes" || url.pathname === "/v2/sandboxes")) {
      const b = JSON.parse(body) as { templateID: string };
      const [v] = await this.makeChildren(b.templateID, 1, c.tenant);
      return this.send(res, 201, { sandboxID: v?.id, templateID: b.templateID, clientID: this.o.id });
    }
    if (req.method === "GET" && (url.pathname === "/sandboxes" || url.pathname === "/v2/sandboxes")) {
      const items = this.visible(c).map((v) => ({
        sandboxID: v.id,
        startedAt: v.created,
        templateID: v.tag,
      }));
      const limit = Number(url.searchParams.get("limit") ?? 100);
      const page = url.pathname === "/sandboxes" ? items : items.reverse().slice(0, limit);
      const more = url.pathname !== "/sandboxes" && items.length > limit;
      return this.send(res, 200, page, {
        "x-total-running": String(items.length),
        ...(more ? { "x-next-token": "more" } : {}),
      });
    }
    return this.send(res, 200, { node: this.o.id, method: req.method, path: req.url });
  }

  /** The node dies: every connection dropped now, its lease no longer kept. */
  kill(): void {
    for (const s of this.sockets) s.destroy();
    for (const s of this.streams) s.destroy();
    this.rest.close();
    this.e2bServer?.close();
    const id = this.lease?.id;
    this.lease = null;
    if (id) void this.o.onKill?.(id);
  }

  /** A clean stop: its lease revoked (its keys go at once), its servers closed. */
  async stop(): Promise<void> {
    await this.lease?.revoke();
    this.lease = null;
    for (const s of this.sockets) s.destroy();
    await new Promise((r) => this.rest.close(r));
    if (this.e2bServer) await new Promise((r) => this.e2bServer?.close(r));
  }
}

/** A catalog entry of snapshot `key` made on `origin` (its view an admin's). */
export function catalogEntry(
  key: string,
  origin: string,
  owner: string | null = null,
  machine = MACHINE,
): CatalogEntry {
  return {
    key,
    owner,
    parent: null,
    digest: "b".repeat(64),
    origin,
    created: new Date().toISOString(),
    machine,
    bytes: 1 << 20,
    view: { tag: key, status: "ready", owner },
  };
}
