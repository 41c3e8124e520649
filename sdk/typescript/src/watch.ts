/**
 * `files.watchDir`: E2B's WatchHandle over the daemon's GET /v1/sandboxes/{id}/files/watch, an
 * NDJSON stream of {"type": create|write|remove|rename|chmod|overflow, "path", "is_dir"?} lines
 * (an optional {"type": "ready"} first, {"type": "error", "error"} when it fails).
 */
import type { IncomingMessage } from "node:http";
import { ForkdError, errorFromEnvelope } from "./errors.js";
import type { Transport } from "./transport.js";

/** E2B's FilesystemEventType; its values are the daemon's event types. */
export const FilesystemEventType = {
  CREATE: "create",
  WRITE: "write",
  REMOVE: "remove",
  RENAME: "rename",
  CHMOD: "chmod",
} as const;
export type FilesystemEventType = (typeof FilesystemEventType)[keyof typeof FilesystemEventType] | "overflow";

export interface FilesystemEvent {
  /** Relative to the watched directory. */
  name: string;
  type: FilesystemEventType;
  path: string;
  isDir?: boolean;
}

const TYPES = new Set(["create", "write", "remove", "rename", "chmod", "overflow"]);

/** The event of a stream line (null for a line that is not one). */
export function eventOf(line: Record<string, unknown>, root: string): FilesystemEvent | null {
  const type = line.type;
  if (typeof type !== "string" || !TYPES.has(type)) return null;
  const path = typeof line.path === "string" ? line.path : "";
  const prefix = root.replace(/\/+$/, "") + "/";
  return {
    name: path.startsWith(prefix) ? path.slice(prefix.length) : path,
    type: type as FilesystemEventType,
    path,
    ...(typeof line.is_dir === "boolean" ? { isDir: line.is_dir } : {}),
  };
}

export class WatchHandle {
  private constructor(private readonly res: IncomingMessage) {}

  /** @internal */
  static async start(
    t: Transport,
    route: string,
    path: string,
    recursive: boolean,
    onEvent: (e: FilesystemEvent) => void | Promise<void>,
    onExit?: (err?: Error) => void,
  ): Promise<WatchHandle> {
    const res = await t.send("GET", route, {
      query: { path, ...(recursive ? { recursive: 1 } : {}) },
      timeoutMs: 0,
    });
    const h = new WatchHandle(res);
    res.setEncoding("utf8");
    let buf = "";
    let failed: Error | undefined;
    res.on("data", (chunk: string) => {
      buf += chunk;
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const raw = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (!raw.trim()) continue;
        let line: Record<string, unknown>;
        try {
          line = JSON.parse(raw) as Record<string, unknown>;
        } catch {
          continue;
        }
        if (line.type === "error") {
          const e = (line.error ?? {}) as {
            code?: string;
            message?: string;
            details?: Record<string, unknown>;
          };
          failed = errorFromEnvelope(200, e.code ?? "internal", e.message ?? "watch failed", e.details ?? {});
          continue;
        }
        const ev = eventOf(line, path);
        if (ev) void Promise.resolve(onEvent(ev)).catch(() => undefined);
      }
    });
    res.once("error", (e) => (failed ??= new ForkdError(e.message, { code: "connection", cause: e })));
    res.once("close", () => onExit?.(h.stopped ? undefined : failed));
    return h;
  }

  private stopped = false;

  /** Ends the watch. */
  stop(): Promise<void> {
    this.stopped = true;
    this.res.destroy();
    return Promise.resolve();
  }
}
