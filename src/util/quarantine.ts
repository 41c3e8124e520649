/**
 * Where recovery puts state it cannot read (a corrupt sandbox record, snapshot metadata that
 * fails its schema or checksum): moved aside to <data>/quarantine/<kind>-<name>-<time>, with a
 * log line saying why, instead of stopping the daemon or deleting what may still be someone's
 * work. An operator inspects and deletes it (docs/operations.md).
 */
import { mkdir, rename, rm } from "node:fs/promises";
import { basename, join } from "node:path";
import { errorMessage } from "./errors.js";

export interface QuarantineLogger {
  warn(msg: string, fields?: Record<string, unknown>): void;
}

export class Quarantine {
  constructor(
    readonly dir: string,
    private readonly log: QuarantineLogger,
  ) {}

  /**
   * Moves `path` (same file system as the data directory) into quarantine; returns where it
   * went. If it cannot be moved, it is removed rather than left where recovery trips on it
   * again.
   */
  async keep(path: string, kind: string, reason: string): Promise<string | null> {
    const stamp = new Date().toISOString().replace(/[:.]/g, "-");
    const to = join(this.dir, `${kind}-${basename(path)}-${stamp}`);
    try {
      await mkdir(this.dir, { recursive: true, mode: 0o700 });
      await rename(path, to);
      this.log.warn("recover: quarantined unreadable state", { kind, path, to, reason });
      return to;
    } catch (e) {
      this.log.warn("recover: cannot quarantine unreadable state; removing it", {
        kind,
        path,
        reason,
        error: errorMessage(e),
      });
      await rm(path, { recursive: true, force: true });
      return null;
    }
  }
}
