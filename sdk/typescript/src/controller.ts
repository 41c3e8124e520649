/** `Controller`: the daemon's snapshots, health and version; `fork()`: many sandboxes at once. */
import { ForkdError } from "./errors.js";
import { forkWith } from "./sandbox.js";
import type { Sandbox, SandboxOpts } from "./sandbox.js";
import { Transport } from "./transport.js";
import type { ConnectionOpts } from "./transport.js";
import type { HealthWire, SnapshotProgressWire, SnapshotWire, VersionWire } from "./types.js";

export type SnapshotInfo = SnapshotWire;

export interface CreateSnapshotOpts {
  tag: string;
  /** Guest image template (default "python", unless `image`). */
  template?: string;
  /** An OCI/Docker image reference to boot instead of a template (e.g. "python:3.11"). */
  image?: string;
  /** Started in the background in the parent before it is frozen (a server every child has up). */
  startCmd?: string;
  /** Run until it exits 0 (after startCmd) before the parent is frozen. */
  readyCmd?: string;
  /** How long readyCmd has to succeed (default 120 000 ms). */
  readyTimeoutMs?: number;
  /** Shell command run in the parent before it is frozen. */
  warm?: string;
  /** A cell run in the parent's warm kernel before it is frozen (its globals are inherited). */
  warmEval?: string;
  /** The kernel warmEval runs in (default python; javascript needs node in the image). */
  warmEvalLanguage?: "python" | "javascript";
  memoryMiB?: number;
  vcpus?: number;
  /** Progress lines while the parent boots and warms. */
  onProgress?: (message: string) => void;
}

export class Controller {
  private readonly t: Transport;

  constructor(opts: ConnectionOpts = {}) {
    this.t = new Transport(opts);
  }

  health(): Promise<HealthWire> {
    return this.t.json("GET", "/v1/health");
  }

  version(): Promise<VersionWire> {
    return this.t.json("GET", "/v1/version");
  }

  async listSnapshots(): Promise<SnapshotInfo[]> {
    return (await this.t.json<{ snapshots: SnapshotInfo[] }>("GET", "/v1/snapshots")).snapshots;
  }

  getSnapshot(tag: string): Promise<SnapshotInfo> {
    return this.t.json("GET", `/v1/snapshots/${encodeURIComponent(tag)}`);
  }

  /** Boots a parent VM, warms it and freezes it (minutes under TCG, seconds with KVM). */
  async createSnapshot(o: CreateSnapshotOpts): Promise<SnapshotInfo> {
    const body = {
      tag: o.tag,
      ...(o.template ? { template: o.template } : {}),
      ...(o.image ? { image: o.image } : {}),
      ...(o.startCmd ? { start_cmd: o.startCmd } : {}),
      ...(o.readyCmd ? { ready_cmd: o.readyCmd } : {}),
      ...(o.readyTimeoutMs ? { ready_timeout_ms: o.readyTimeoutMs } : {}),
      ...(o.warm ? { warm: o.warm } : {}),
      ...(o.warmEval ? { warm_eval: o.warmEval } : {}),
      // sent only when not python, so a daemon from before the field takes Python warm-ups
      ...(o.warmEvalLanguage && o.warmEvalLanguage !== "python"
        ? { warm_eval_language: o.warmEvalLanguage }
        : {}),
      ...(o.memoryMiB ? { memory_mib: o.memoryMiB } : {}),
      ...(o.vcpus ? { vcpus: o.vcpus } : {}),
    };
    let done: SnapshotInfo | null = null;
    let failed: ForkdError | null = null;
    await this.t.ndjson<SnapshotProgressWire>(
      "POST",
      "/v1/snapshots",
      (ev) => {
        if (ev.type === "progress") o.onProgress?.(ev.message);
        else if (ev.type === "done") done = ev.snapshot;
        else failed = new ForkdError(ev.error.message, { code: ev.error.code, details: ev.error.details });
      },
      { json: body, query: { stream: 1 } },
    );
    if (failed) throw failed as ForkdError;
    if (!done) throw new ForkdError("snapshot stream ended without a result", { code: "connection" });
    return done;
  }

  async deleteSnapshot(tag: string): Promise<void> {
    await this.t.json("DELETE", `/v1/snapshots/${encodeURIComponent(tag)}`);
  }

  /** Forks `n` children of `snapshot` at once (see fork()). */
  fork(
    snapshot: string,
    n: number,
    opts: Omit<SandboxOpts, keyof ConnectionOpts | "snapshot"> = {},
  ): Promise<Sandbox[]> {
    return forkWith(this.t, snapshot, n, opts);
  }
}

/**
 * Forks `n` children of `snapshot` in one request: they start in parallel and this returns when
 * every one answers. If some fail, throws ForkError, whose `sandboxes` holds the ones running.
 */
export function fork(snapshot: string, n: number, opts: SandboxOpts = {}): Promise<Sandbox[]> {
  return forkWith(new Transport(opts), snapshot, n, opts);
}
