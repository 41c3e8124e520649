/**
 * Exposed guest ports: a TCP listener on the host (FORKD_EXPOSE_ADDR, default 127.0.0.1) per
 * port, relaying each connection to the guest through its slot (the slot's address, where the
 * namespace's rules pass it on to the guest). User-mode children outside a slot use QEMU's own
 * hostfwd instead (./attachments/user.ts); this is for those in a slot. Connections are bounded
 * overall and per client address.
 */
import { createServer, connect } from "node:net";
import type { Server, Socket } from "node:net";
import { ForkdError, errorMessage } from "../util/index.js";
import { ConnectionGate, DEFAULT_LIMITS } from "../util/index.js";

/** Connections one exposed port relays at once. */
const MAX_CONNECTIONS = 256;
/** ... and from one client address (IPv6: one /64). */
const PER_ADDRESS = Math.min(DEFAULT_LIMITS.perAddress, MAX_CONNECTIONS / 4);
const CONNECT_TIMEOUT_MS = 10_000;

export class PortRelay {
  private closed = false;

  private constructor(
    private readonly server: Server,
    /** Open connections, both ends. */
    private readonly sockets: Set<Socket>,
    readonly hostAddr: string,
    readonly hostPort: number,
  ) {}

  /**
   * Listens on `hostAddr:hostPort` (0: any free port; a wanted port that is taken falls back to
   * a free one) and relays to `target`.
   */
  static async listen(
    hostAddr: string,
    hostPort: number,
    target: { host: string; port: number },
  ): Promise<PortRelay> {
    const sockets = new Set<Socket>();
    // Bounded overall and per client address (../util/listener-guard.ts): one client cannot take
    // every connection of the port.
    const gate = new ConnectionGate({ maxConnections: MAX_CONNECTIONS, perAddress: PER_ADDRESS });
    const server = createServer({ pauseOnConnect: true }, (client) => {
      if (!gate.admit(client)) return;
      sockets.add(client);
      const upstream = connect({ host: target.host, port: target.port });
      sockets.add(upstream);
      const timer = setTimeout(() => upstream.destroy(new Error("connect timeout")), CONNECT_TIMEOUT_MS);
      const done = () => {
        clearTimeout(timer);
        client.destroy();
        upstream.destroy();
        sockets.delete(client);
        sockets.delete(upstream);
      };
      upstream.once("connect", () => {
        clearTimeout(timer);
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      });
      client.on("error", done).on("close", done);
      upstream.on("error", done).on("close", done);
    });
    const bind = (port: number) =>
      new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen({ host: hostAddr, port, exclusive: true }, () => {
          server.off("error", reject);
          resolve();
        });
      });
    try {
      await bind(hostPort);
    } catch (e) {
      if (hostPort === 0)
        throw new ForkdError("unavailable", `cannot listen on ${hostAddr}: ${errorMessage(e)}`);
      await bind(0).catch((e2: unknown) => {
        throw new ForkdError("unavailable", `cannot listen on ${hostAddr}: ${errorMessage(e2)}`);
      });
    }
    const addr = server.address();
    const port = typeof addr === "object" && addr ? addr.port : 0;
    return new PortRelay(server, sockets, hostAddr, port);
  }

  /** Stops listening and cuts the relayed connections. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** A free TCP port on `addr` right now (for QEMU's hostfwd, which binds it itself a moment later). */
export async function freePort(addr: string): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen({ host: addr, port: 0, exclusive: true }, () => resolve());
  });
  const a = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (typeof a !== "object" || !a) throw new ForkdError("internal", "no port");
  return a.port;
}
