/** `Sandbox`: one forked microVM, shaped like E2B's Sandbox. */
import { Commands } from "./commands.js";
import { executionOf } from "./code.js";
import type { Execution } from "./code.js";
import { ConflictError, ForkdError, InvalidArgumentError, NotFoundError } from "./errors.js";
import { Files } from "./files.js";
import { Transport } from "./transport.js";
import type { ConnectionOpts } from "./transport.js";
import type {
  BranchResultWire,
  EvalResultWire,
  ForkResultWire,
  NetworkRequestWire,
  SandboxWire,
} from "./types.js";

/** The snapshot `Sandbox.create()` uses when given none. Created on first use (python template). */
export const DEFAULT_SNAPSHOT = "default";

export interface SandboxOpts extends ConnectionOpts {
  /** Snapshot tag to fork (default: $FORKD_SNAPSHOT, else "default", created on first use). */
  snapshot?: string;
  /** Idle timeout: the daemon kills the sandbox when no API call used it for this long. */
  timeoutMs?: number;
  metadata?: Record<string, string>;
  /** What the idle timeout does: "kill" (default) or "pause" (Sandbox.resume(id) brings it back). */
  onIdle?: "kill" | "pause";
  /**
   * Host-side limits: memory of its VMM in MiB (default guest RAM + 384; past it the sandbox is
   * killed and its exit reason says so), a CPU quota in cores, and the number of processes of its
   * guest workload (default 1024), and the host disk its own disk layers may take (what it wrote
   * since the fork; past it the sandbox is killed, its exit reason says so), and a lifetime after
   * which it is killed whatever it does.
   */
  limits?: { memoryMiB?: number; cpus?: number; pids?: number; diskMiB?: number; lifetimeMs?: number };
  /**
   * Its network (default: none). E.g. `{ mode: "netns", egress: { mode: "list", allow: [{ cidr:
   * "203.0.113.0/24", ports: [443] }] }, expose: [8000] }`; see docs/api.md.
   */
  network?: NetworkOpts;
}

/** A sandbox's network as asked for at creation (the API's NetworkRequest). */
export type NetworkOpts = NetworkRequestWire;

/** A sandbox's network as it is. */
export interface NetworkInfo {
  mode: "none" | "user" | "netns";
  /** The guest's address (the same in every sandbox); null without a network. */
  guestIp: string | null;
  egress: SandboxWire["network"]["egress"];
  /** Exposed guest ports and the "host:port" where each answers (while it runs). */
  ports: Array<{ port: number; host: string }>;
}

export interface SandboxInfo {
  sandboxId: string;
  /** The snapshot it was forked from. */
  snapshot: string;
  /** E2B's name for `snapshot`. */
  templateId: string;
  pid: number;
  state: "running" | "paused" | "exited";
  startedAt: Date;
  exitReason: string | null;
  timeoutMs: number | null;
  /** When it will be killed: its idle timeout unless it is used first, or its lifetime's end. */
  endAt: Date | null;
  metadata: Record<string, string>;
  /** Fork timings measured by the daemon (ms). */
  timings: { launchMs: number; restoreMs: number; readyMs: number; totalMs: number };
  /** The host-side limits in force (null: not limited). */
  limits: {
    memoryMiB: number | null;
    cpus: number | null;
    pids: number | null;
    diskMiB: number | null;
    lifetimeMs: number | null;
  };
  network: NetworkInfo;
}

export interface BranchOpts {
  /** Tag of the new snapshot (default: br-<random>). */
  tag?: string;
  /** Wait until the snapshot is ready (default true); false returns once the sandbox runs again. */
  wait?: boolean;
}

export interface BranchInfo {
  /** The new snapshot: fork it with fork(tag, n) or Sandbox.create({ snapshot: tag }). */
  tag: string;
  status: "ready" | "writing";
  /** How long this sandbox was paused. */
  pauseMs: number;
  /** Memory it had written since its fork (what the pause copied). */
  privateBytes: number;
}

/** The kernels a sandbox can have: which ones an image has depends on its interpreters. */
export const LANGUAGES = ["python", "javascript"] as const;
export type Language = (typeof LANGUAGES)[number];

export interface RunCodeOpts {
  /**
   * "python" (default) or "javascript" (the Node kernel: needs `node` in the image, e.g. the
   * `node` template). Sent to the daemon only when it is not "python", so Python cells also work
   * against a daemon from before the field.
   */
  language?: Language;
  timeoutMs?: number;
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
}

/** @internal */
/** The earlier of two optional ISO times. */
function earliest(a: string | null, b: string | null): Date | null {
  const t = [a, b].filter((x): x is string => x !== null).map((x) => Date.parse(x));
  return t.length > 0 ? new Date(Math.min(...t)) : null;
}

export function infoOf(w: SandboxWire): SandboxInfo {
  return {
    sandboxId: w.id,
    snapshot: w.tag,
    templateId: w.tag,
    pid: w.pid,
    state: w.state,
    startedAt: new Date(w.created),
    exitReason: w.exit_reason,
    timeoutMs: w.timeout_ms,
    endAt: earliest(w.expires_at, w.ends_at),
    limits: {
      memoryMiB: w.limits.memory_mib,
      cpus: w.limits.cpus,
      pids: w.limits.pids,
      diskMiB: w.limits.disk_mib,
      lifetimeMs: w.limits.lifetime_ms,
    },
    metadata: w.metadata,
    timings: {
      launchMs: w.timings.launch_ms,
      restoreMs: w.timings.restore_ms,
      readyMs: w.timings.ready_ms,
      totalMs: w.timings.total_ms,
    },
    network: {
      mode: w.network.mode,
      guestIp: w.network.guest_ip,
      egress: w.network.egress,
      ports: w.network.ports,
    },
  };
}

export class Sandbox {
  readonly sandboxId: string;
  readonly commands: Commands;
  readonly files: Files;

  /** @internal Use Sandbox.create(), Sandbox.connect() or fork(). */
  constructor(
    id: string,
    private readonly t: Transport,
  ) {
    this.sandboxId = id;
    this.commands = new Commands(t, id);
    this.files = new Files(t, id);
  }

  /** Forks one child of a snapshot (E2B: `Sandbox.create(template?, opts?)`). */
  static create(opts?: SandboxOpts): Promise<Sandbox>;
  static create(snapshot: string, opts?: SandboxOpts): Promise<Sandbox>;
  static async create(a?: string | SandboxOpts, b: SandboxOpts = {}): Promise<Sandbox> {
    const opts = typeof a === "string" ? { ...b, snapshot: a } : (a ?? {});
    const t = new Transport(opts);
    const explicit = opts.snapshot ?? process.env.FORKD_SNAPSHOT;
    const tag = explicit ?? DEFAULT_SNAPSHOT;
    try {
      const [sb] = await forkWith(t, tag, 1, opts);
      if (!sb) throw new ForkdError("the daemon returned no sandbox");
      return sb;
    } catch (e) {
      if (!(e instanceof NotFoundError) || explicit !== undefined) throw e;
      // The default snapshot does not exist yet: create it once, then fork.
      await ensureDefaultSnapshot(t);
      const [sb] = await forkWith(t, tag, 1, opts);
      if (!sb) throw new ForkdError("the daemon returned no sandbox");
      return sb;
    }
  }

  /** A running sandbox by id. */
  static async connect(sandboxId: string, opts: ConnectionOpts = {}): Promise<Sandbox> {
    const t = new Transport(opts);
    const w = await t.json<SandboxWire>("GET", `/v1/sandboxes/${encodeURIComponent(sandboxId)}`);
    if (w.state !== "running") {
      throw new ConflictError(`sandbox ${sandboxId} is not running (${w.exit_reason ?? w.state})`, {
        code: "conflict",
        status: 409,
      });
    }
    return new Sandbox(w.id, t);
  }

  /** Sandboxes the daemon knows, optionally only those whose metadata has every given pair. */
  static async list(
    opts: ConnectionOpts & {
      query?: { metadata?: Record<string, string>; state?: "running" | "exited" };
    } = {},
  ): Promise<SandboxInfo[]> {
    const t = new Transport(opts);
    const r = await t.json<{ sandboxes: SandboxWire[] }>("GET", "/v1/sandboxes");
    const want = opts.query?.metadata ?? {};
    return r.sandboxes
      .filter((s) => Object.entries(want).every(([k, v]) => s.metadata[k] === v))
      .filter((s) => !opts.query?.state || s.state === opts.query.state)
      .map(infoOf);
  }

  /** A sandbox's state by id (also one that exited: its exitReason says why). */
  static async getInfo(sandboxId: string, opts: ConnectionOpts = {}): Promise<SandboxInfo> {
    const t = new Transport(opts);
    return infoOf(await t.json<SandboxWire>("GET", `/v1/sandboxes/${encodeURIComponent(sandboxId)}`));
  }

  /** Brings a paused sandbox back: same id, files and processes. */
  static async resume(sandboxId: string, opts: ConnectionOpts = {}): Promise<Sandbox> {
    const t = new Transport(opts);
    const w = await t.json<SandboxWire>("POST", `/v1/sandboxes/${encodeURIComponent(sandboxId)}/resume`, {
      timeoutMs: 0,
    });
    return new Sandbox(w.id, t);
  }

  /** Kills a sandbox by id. False if there was none. */
  static async kill(sandboxId: string, opts: ConnectionOpts = {}): Promise<boolean> {
    const t = new Transport(opts);
    try {
      await t.json("DELETE", `/v1/sandboxes/${encodeURIComponent(sandboxId)}`, { timeoutMs: 60_000 });
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  static async setTimeout(
    sandboxId: string,
    timeoutMs: number | null,
    opts: ConnectionOpts = {},
  ): Promise<void> {
    await new Sandbox(sandboxId, new Transport(opts)).setTimeout(timeoutMs);
  }

  /** Kills this sandbox. False if it was already gone. */
  async kill(): Promise<boolean> {
    try {
      await this.t.json("DELETE", `/v1/sandboxes/${this.sandboxId}`, { timeoutMs: 60_000 });
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /**
   * Saves the sandbox's whole state (memory, disk, processes) and stops its VM, freeing its
   * memory; Sandbox.resume(id) brings it back, also after a daemon restart.
   */
  async pause(): Promise<void> {
    await this.t.json("POST", `/v1/sandboxes/${this.sandboxId}/pause`, { timeoutMs: 0 });
  }

  /** Sets the idle timeout, counted from now (null: never). */
  async setTimeout(timeoutMs: number | null): Promise<void> {
    await this.t.json("POST", `/v1/sandboxes/${this.sandboxId}/timeout`, { json: { timeout_ms: timeoutMs } });
  }

  async getInfo(): Promise<SandboxInfo> {
    return infoOf(await this.t.json<SandboxWire>("GET", `/v1/sandboxes/${this.sandboxId}`));
  }

  /**
   * Where guest TCP port `port` answers on the host, as "host:port" (E2B: `getHost(port)`). A port
   * not exposed yet is exposed now (the sandbox needs a network: mode user or netns).
   */
  async getHost(port: number): Promise<string> {
    const info = await this.getInfo();
    const p = info.network.ports.find((x) => x.port === port);
    if (p) return p.host;
    return this.expose(port);
  }

  /** Stops exposing guest TCP port `port` on the host. */
  async unexpose(port: number): Promise<void> {
    await this.t.json("DELETE", `/v1/sandboxes/${this.sandboxId}/ports/${port}`);
  }

  /**
   * Replaces the egress policy while it runs, e.g. `{ mode: "deny" }` once dependencies are
   * installed (network netns, or user created with egress allow or list).
   */
  async setEgress(egress: NonNullable<NetworkOpts["egress"]>): Promise<void> {
    await this.t.json("POST", `/v1/sandboxes/${this.sandboxId}/egress`, { json: egress });
  }

  /** Exposes guest TCP port `port` on the host while the sandbox lives; returns "host:port". */
  async expose(port: number): Promise<string> {
    const w = await this.t.json<SandboxWire>("POST", `/v1/sandboxes/${this.sandboxId}/ports`, {
      json: { port },
    });
    const host = w.network.ports.find((x) => x.port === port)?.host;
    if (!host) throw new InvalidArgumentError(`port ${port} was not exposed`, { code: "invalid_argument" });
    return host;
  }

  async isRunning(): Promise<boolean> {
    try {
      return (await this.getInfo()).state === "running";
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /**
   * BRANCH: snapshots this running sandbox (memory, disk, processes, interpreter state) with a
   * short pause, as a new snapshot tag to fork: try several next steps from the same state.
   */
  async branch(opts: BranchOpts = {}): Promise<BranchInfo> {
    const r = await this.t.json<BranchResultWire>("POST", `/v1/sandboxes/${this.sandboxId}/branch`, {
      json: { ...(opts.tag ? { tag: opts.tag } : {}), wait: opts.wait ?? true },
      timeoutMs: 0,
    });
    return { tag: r.tag, status: r.status, pauseMs: r.pause_ms, privateBytes: r.private_bytes };
  }

  /**
   * Runs a notebook cell in the sandbox's warm interpreter (Python, or JavaScript with
   * `language: "javascript"`): statements run, the final expression's value is the main result,
   * globals persist across cells (and a forked child inherits its parent's), errors come back in
   * `execution.error` (not thrown). A language the image has no interpreter for is an
   * UnavailableError (code `unavailable`).
   */
  async runCode(code: string, opts: RunCodeOpts = {}): Promise<Execution> {
    const language: string = opts.language ?? "python";
    if (!(LANGUAGES as readonly string[]).includes(language)) {
      throw new InvalidArgumentError(`no ${language} kernel (known: ${LANGUAGES.join(", ")})`, {
        code: "invalid_argument",
      });
    }
    const timeoutMs = opts.timeoutMs ?? 60_000;
    const w = await this.t.json<EvalResultWire>("POST", `/v1/sandboxes/${this.sandboxId}/eval`, {
      json: { code, timeout_ms: timeoutMs, ...(language !== "python" ? { language } : {}) },
      timeoutMs: timeoutMs + 30_000,
    });
    if (w.stdout) opts.onStdout?.(w.stdout);
    if (w.stderr) opts.onStderr?.(w.stderr);
    return executionOf(w);
  }
}

/** @internal Forks `n` children; all or an error (the ones that started are killed). */
export async function forkWith(
  t: Transport,
  tag: string,
  n: number,
  opts: SandboxOpts = {},
): Promise<Sandbox[]> {
  const r = await t.json<ForkResultWire>("POST", "/v1/sandboxes", {
    json: {
      snapshot_tag: tag,
      n,
      ...(opts.timeoutMs !== undefined ? { timeout_ms: opts.timeoutMs } : {}),
      ...(opts.metadata ? { metadata: opts.metadata } : {}),
      ...(opts.onIdle ? { on_idle: opts.onIdle } : {}),
      ...(opts.limits
        ? {
            limits: {
              ...(opts.limits.memoryMiB !== undefined ? { memory_mib: opts.limits.memoryMiB } : {}),
              ...(opts.limits.cpus !== undefined ? { cpus: opts.limits.cpus } : {}),
              ...(opts.limits.pids !== undefined ? { pids: opts.limits.pids } : {}),
              ...(opts.limits.diskMiB !== undefined ? { disk_mib: opts.limits.diskMiB } : {}),
              ...(opts.limits.lifetimeMs !== undefined ? { lifetime_ms: opts.limits.lifetimeMs } : {}),
            },
          }
        : {}),
      ...(opts.network ? { network: opts.network } : {}),
    },
    timeoutMs: 0,
  });
  const sandboxes = r.sandboxes.map((s) => new Sandbox(s.id, t));
  if (r.failures.length > 0) throw new ForkError(sandboxes, r.failures);
  return sandboxes;
}

/** Some children of a fork failed; the ones that started are in `sandboxes` (still running). */
export class ForkError extends ForkdError {
  constructor(
    readonly sandboxes: Sandbox[],
    readonly failures: ForkResultWire["failures"],
  ) {
    super(
      `${failures.length} of ${failures.length + sandboxes.length} children failed: ${failures[0]?.message ?? ""}`,
      { code: "fork_partial", details: { failures } },
    );
  }
}

async function ensureDefaultSnapshot(t: Transport): Promise<void> {
  try {
    await t.json("POST", "/v1/snapshots", {
      json: { tag: DEFAULT_SNAPSHOT, template: "python" },
      timeoutMs: 0,
    });
  } catch (e) {
    // Someone else is creating it: wait for it.
    if (!(e instanceof ConflictError)) throw e;
    const deadline = Date.now() + 15 * 60_000;
    while (Date.now() < deadline) {
      try {
        await t.json("GET", `/v1/snapshots/${DEFAULT_SNAPSHOT}`);
        return;
      } catch (err) {
        if (!(err instanceof NotFoundError)) throw err;
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
    throw e;
  }
}
