/**
 * The audit log: one JSON line per mutating API call, appended to <data>/audit/audit.jsonl
 * (mode 0600, O_APPEND) and fsynced.
 *
 * Appending never waits on the disk and never fails the call it records: lines are queued and
 * a single writer writes whatever has queued up since its last write in one write + fsync, so
 * a line is on disk one fsync after the call (a burst shares one fsync). A line that cannot be
 * written (disk full, I/O error), or that finds the queue full, is dropped and counted; the
 * next batch reopens the file.
 *
 * Rotation by size: before a batch that would take the file past `maxBytes`, audit.jsonl
 * becomes audit.jsonl.1 (.1 becomes .2, …; the oldest past `keep` is deleted).
 */
import type { FileHandle } from "node:fs/promises";
import { mkdir, open, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { fsyncDir } from "../util/index.js";

export interface AuditRecord {
  /** When the call started (ISO 8601, UTC). */
  ts: string;
  request_id: string;
  /** "local" (unix socket), "admin" (FORKD_TOKEN), a tenant, or "anonymous" (no valid token). */
  caller: string;
  /** The token's id, when the caller used one from the tokens file. */
  token: string | null;
  /**
   * The tenant the caller was scoped to; null for an admin (the socket, FORKD_TOKEN, an admin
   * token). What a tenant's audit query matches: `caller` names are not unique (a tenant may be
   * called "admin", an admin token carries a tenant label). Absent in lines of older daemons.
   */
  tenant?: string | null;
  /** Peer address on TCP (null on the unix socket). */
  remote: string | null;
  /** Method and route template, e.g. "POST /v1/sandboxes/{id}/exec". */
  action: string;
  /** What the call named or made: path parameters, and ids it created. */
  target: Record<string, string | string[]>;
  status: number;
  /** "ok", or the error code of the reply. */
  result: string;
  duration_ms: number;
}

export interface AuditOptions {
  dir: string;
  /** Rotate before the file grows past this (default 64 MiB). */
  maxBytes?: number;
  /** Rotated files kept (default 8). */
  keep?: number;
  /** Lines waiting for the writer at most (default 10 000); more are dropped and counted. */
  maxQueue?: number;
  onError?: (e: unknown) => void;
}

export interface AuditStats {
  written: number;
  dropped: number;
  failed: number;
}

export const AUDIT_FILE = "audit.jsonl";

export class AuditLog {
  private fh: FileHandle | null = null;
  private size = 0;
  private queue: string[] = [];
  private running: Promise<void> | null = null;
  private closed = false;
  readonly stats: AuditStats = { written: 0, dropped: 0, failed: 0 };
  private readonly maxBytes: number;
  private readonly keep: number;
  private readonly maxQueue: number;

  private constructor(private readonly o: AuditOptions) {
    this.maxBytes = o.maxBytes ?? 64 << 20;
    this.keep = Math.max(1, o.keep ?? 8);
    this.maxQueue = o.maxQueue ?? 10_000;
  }

  /** Opens (creating) the log; fails only if its directory cannot be made. */
  static async open(o: AuditOptions): Promise<AuditLog> {
    await mkdir(o.dir, { recursive: true, mode: 0o700 });
    const log = new AuditLog(o);
    await log.reopen().catch((e: unknown) => o.onError?.(e));
    return log;
  }

  get path(): string {
    return join(this.o.dir, AUDIT_FILE);
  }

  append(r: AuditRecord): void {
    if (this.closed || this.queue.length >= this.maxQueue) {
      this.stats.dropped++;
      return;
    }
    this.queue.push(JSON.stringify(r) + "\n");
    this.running ??= this.drain();
  }

  /** Resolves once every line appended so far is written (or counted as failed). */
  async flush(): Promise<void> {
    while (this.running) await this.running;
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.flush();
    await this.fh?.close().catch(() => undefined);
    this.fh = null;
  }

  private async drain(): Promise<void> {
    try {
      while (this.queue.length > 0) {
        const batch = this.queue;
        this.queue = [];
        const data = Buffer.from(batch.join(""), "utf8");
        try {
          let fh = this.fh ?? (await this.reopen());
          if (this.size > 0 && this.size + data.length > this.maxBytes) fh = await this.rotate();
          await fh.write(data);
          await fh.sync();
          this.size += data.length;
          this.stats.written += batch.length;
        } catch (e) {
          this.stats.failed += batch.length;
          this.o.onError?.(e);
          await this.fh?.close().catch(() => undefined);
          this.fh = null;
        }
      }
    } finally {
      this.running = null;
    }
  }

  private async reopen(): Promise<FileHandle> {
    const fh = await open(this.path, "a", 0o600);
    this.size = (await fh.stat()).size;
    this.fh = fh;
    return fh;
  }

  private async rotate(): Promise<FileHandle> {
    await this.fh?.close();
    this.fh = null;
    const p = this.path;
    await rm(`${p}.${this.keep}`, { force: true });
    for (let i = this.keep - 1; i >= 1; i--) {
      await rename(`${p}.${i}`, `${p}.${i + 1}`).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== "ENOENT") throw e;
      });
    }
    await rename(p, `${p}.1`);
    await fsyncDir(this.o.dir);
    return this.reopen();
  }
}
