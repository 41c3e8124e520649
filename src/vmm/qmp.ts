/**
 * QMP client: QEMU's JSON control protocol over a unix socket. One line per message; replies are
 * matched by id. A VMM may be compromised by its guest, so lines are bounded and every command
 * has a deadline.
 */
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { ForkdError } from "../util/index.js";
import { dialUnix } from "../util/index.js";

const MAX_LINE = 1 << 20;

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
  command: string;
}

export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
}

export class QmpClient extends EventEmitter {
  private buf = "";
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private closedError: ForkdError | null = null;

  private constructor(private readonly socket: Socket) {
    super();
  }

  /** Connects (retrying until the socket exists), reads the greeting, negotiates capabilities. */
  static async connect(path: string, timeoutMs = 10_000, signal?: AbortSignal): Promise<QmpClient> {
    const deadline = Date.now() + timeoutMs;
    const socket = await dialUnix(path, timeoutMs, "QMP", signal);
    const client = new QmpClient(socket);
    const greeting = new Promise<void>((resolve, reject) => {
      const t = setTimeout(
        () => reject(new ForkdError("timeout", "no QMP greeting")),
        Math.max(1, deadline - Date.now()) + 1000,
      );
      client.once("greeting", () => {
        clearTimeout(t);
        resolve();
      });
      client.once("close", (e: Error) => {
        clearTimeout(t);
        reject(e);
      });
    });
    client.attach();
    await greeting;
    await client.execute("qmp_capabilities");
    return client;
  }

  private attach(): void {
    this.socket.setEncoding("utf8");
    this.socket.on("data", (chunk: string) => {
      this.buf += chunk;
      if (this.buf.length > MAX_LINE && !this.buf.includes("\n")) {
        this.fail(new ForkdError("vmm_error", "QMP line too long"));
        return;
      }
      let nl: number;
      while ((nl = this.buf.indexOf("\n")) >= 0) {
        const line = this.buf.slice(0, nl).trim();
        this.buf = this.buf.slice(nl + 1);
        if (line) this.onLine(line);
      }
    });
    this.socket.on("error", (e) => this.fail(new ForkdError("unavailable", `QMP: ${e.message}`)));
    this.socket.on("close", () => this.fail(new ForkdError("unavailable", "QMP connection closed")));
  }

  private onLine(line: string): void {
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.fail(new ForkdError("vmm_error", "QMP sent invalid JSON"));
      return;
    }
    if ("QMP" in msg) {
      this.emit("greeting", msg.QMP);
      return;
    }
    if (typeof msg.event === "string") {
      this.emit("event", { event: msg.event, data: msg.data });
      return;
    }
    const id = msg.id;
    if (typeof id !== "number") return;
    const p = this.pending.get(id);
    if (!p) return;
    this.pending.delete(id);
    clearTimeout(p.timer);
    if ("error" in msg) {
      const err = msg.error as { class?: string; desc?: string };
      p.reject(new ForkdError("vmm_error", `QMP ${p.command}: ${err.desc ?? "error"}`, { class: err.class }));
    } else {
      p.resolve(msg.return);
    }
  }

  private fail(err: ForkdError): void {
    if (this.closedError) return;
    this.closedError = err;
    this.socket.destroy();
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    this.pending.clear();
    this.emit("close", err);
  }

  get closed(): boolean {
    return this.closedError !== null;
  }

  execute<T = unknown>(command: string, args?: Record<string, unknown>, timeoutMs = 10_000): Promise<T> {
    if (this.closedError) return Promise.reject(this.closedError);
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new ForkdError("timeout", `QMP ${command} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, timer, command });
      this.socket.write(
        JSON.stringify(args ? { execute: command, arguments: args, id } : { execute: command, id }) + "\n",
      );
    });
  }

  close(): void {
    this.fail(new ForkdError("unavailable", "QMP connection closed by host"));
  }
}
