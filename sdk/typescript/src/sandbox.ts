/** `Sandbox`: one forked microVM, shaped like E2B's Sandbox. */
import { randomBytes } from "node:crypto";
import { Commands } from "./commands.js";
import { Context, executionOf } from "./code.js";
import type { Execution, ExecutionError, Result } from "./code.js";
import {
  ConflictError,
  ForkdError,
  InvalidArgumentError,
  NotFoundError,
  errorFromEnvelope,
} from "./errors.js";
import { Files } from "./files.js";
import { Layout } from "./layout.js";
import { Pty } from "./pty.js";
import { SandboxPaginator } from "./paginator.js";
import type { SandboxQuery } from "./paginator.js";
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
  /**
   * E2B's timeout, absolute: `timeoutMs` after its creation the daemon kills the sandbox (or
   * pauses it: lifecycle.onTimeout), busy or idle; setTimeout() moves it. Default: none.
   */
  timeoutMs?: number;
  /** forkd's idle timeout: the daemon kills (onIdle) the sandbox when no API call used it for this long. */
  idleTimeoutMs?: number;
  metadata?: Record<string, string>;
  /** What the idle timeout does: "kill" (default) or "pause" (Sandbox.resume(id) brings it back). */
  onIdle?: "kill" | "pause";
  /** The sandbox's environment: every command and cell sees it, under their own envs. */
  envs?: Record<string, string>;
  /**
   * E2B's lifecycle: `onTimeout` is what the (absolute) timeout does; a paused sandbox comes back
   * by connect() (the daemon does not auto-resume it on traffic).
   */
  lifecycle?: { onTimeout: "kill" | "pause" | { action: "kill" | "pause" }; autoResume?: boolean };
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
  state: "running" | "paused" | "exited" | "lost";
  startedAt: Date;
  exitReason: string | null;
  /** The cluster node it runs on; null: its daemon runs alone (not in a cluster). */
  node: string | null;
  /** forkd's idle timeout (ms; null: none). */
  idleTimeoutMs: number | null;
  /** E2B's absolute timeout: when it is killed (or paused: lifecycle.onTimeout); null: none. */
  deadline: Date | null;
  /** When it will end: its deadline, its idle timeout unless it is used first, or its lifetime's end. */
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
  /** E2B's lifecycle: onTimeout is what the deadline (E2B's timeout) does. */
  lifecycle: { onTimeout: "kill" | "pause"; autoResume: boolean };
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
  /** Each result (the main one and displayed objects) and the error, once the cell ran. */
  onResult?: (r: Result) => void;
  onError?: (e: ExecutionError) => void;
  /** An interpreter context of its own (createCodeContext). */
  context?: Context | string;
  /** Environment of this cell only (over the sandbox's). */
  envs?: Record<string, string>;
}

/** E2B's SnapshotInfo: `snapshotId` is a forkd snapshot tag (Sandbox.create(snapshotId) forks it). */
export interface SnapshotInfo {
  snapshotId: string;
  names: string[];
}

/** E2B's SandboxMetrics, from the daemon's host-side view of the sandbox's VM. */
export interface SandboxMetrics {
  timestamp: Date;
  cpuUsedPct: number;
  cpuCount: number;
  memUsed: number;
  memTotal: number;
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

interface MetricsWire {
  metrics: Array<{
    timestamp: string;
    cpu_used_pct: number;
    cpu_count: number;
    mem_used: number;
    mem_total: number;
    disk_used: number;
    disk_total: number;
  }>;
}

const q = encodeURIComponent;

/** @internal */
/** The earlier of two optional ISO times. */
function earliest(...at: (string | null)[]): Date | null {
  const t = at.filter((x): x is string => typeof x === "string").map((x) => Date.parse(x));
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
    node: w.node ?? null,
    idleTimeoutMs: w.timeout_ms,
    deadline: typeof w.deadline === "string" ? new Date(w.deadline) : null,
    endAt: earliest(w.deadline, w.expires_at, w.ends_at),
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
    lifecycle: { onTimeout: w.on_deadline ?? "kill", autoResume: false },
  };
}

export class Sandbox {
  readonly sandboxId: string;
  readonly commands: Commands;
  readonly files: Files;
  /** Pseudo-terminals (E2B's sandbox.pty). */
  readonly pty: Pty;

  readonly #envs: Record<string, string>;
  #cellEnv = true;

  /** @internal Use Sandbox.create(), Sandbox.connect() or fork(). */
  constructor(
    id: string,
    private readonly t: Transport,
    envs: Record<string, string> = {},
  ) {
    this.sandboxId = id;
    this.#envs = { ...envs };
    const layout = new Layout(t, id);
    this.commands = new Commands(t, id, layout, this.#envs);
    this.files = new Files(t, id, layout);
    this.pty = new Pty(this.commands, t, id);
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

  /**
   * A sandbox by id (E2B's connect): a paused one is resumed first; `timeoutMs` sets its (absolute)
   * timeout from now.
   * An exited one is a ConflictError.
   */
  static async connect(
    sandboxId: string,
    opts: ConnectionOpts & { timeoutMs?: number } = {},
  ): Promise<Sandbox> {
    const t = new Transport(opts);
    return new Sandbox(await connectTo(t, sandboxId, opts.timeoutMs), t);
  }

  /** Resumes this sandbox if it is paused (E2B's sandbox.connect()). */
  async connect(opts: { timeoutMs?: number } = {}): Promise<this> {
    await connectTo(this.t, this.sandboxId, opts.timeoutMs);
    return this;
  }

  /**
   * E2B's paginator over the sandboxes: `query` ({ metadata, state: ["running", "paused"] }),
   * `limit` per page, `nextToken` to start from; `hasNext` / `nextItems()`. Awaiting it reads
   * every page (what this method returned before: an array).
   */
  static list(
    opts: ConnectionOpts & { query?: SandboxQuery; limit?: number; nextToken?: string } = {},
  ): SandboxPaginator<SandboxInfo> {
    return new SandboxPaginator(new Transport(opts), opts.query ?? {}, opts.limit, opts.nextToken, infoOf);
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

  /** Pauses a sandbox by id (see pause()). */
  static pause(sandboxId: string, opts: ConnectionOpts = {}): Promise<boolean> {
    return pauseIt(new Transport(opts), sandboxId);
  }

  /** E2B's metrics samples of a sandbox by id (see getMetrics()). */
  static getMetrics(
    sandboxId: string,
    opts: ConnectionOpts & { start?: Date; end?: Date } = {},
  ): Promise<SandboxMetrics[]> {
    return metricsOf(new Transport(opts), sandboxId, opts);
  }

  /** Snapshots made by createSnapshot (of `sandboxId` when given). */
  static listSnapshots(opts: ConnectionOpts & { sandboxId?: string } = {}): Promise<SnapshotInfo[]> {
    return snapshotsOf(new Transport(opts), opts.sandboxId);
  }

  /** Deletes a snapshot. False if there was none (409 while sandboxes run from it). */
  static deleteSnapshot(snapshotId: string, opts: ConnectionOpts = {}): Promise<boolean> {
    return deleteSnap(new Transport(opts), snapshotId);
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
   * memory; connect() or Sandbox.resume(id) brings it back, also after a daemon restart. True once
   * paused, false if it already was (forkd always keeps the memory: keepMemory false too).
   */
  pause(_opts: { keepMemory?: boolean } = {}): Promise<boolean> {
    return pauseIt(this.t, this.sandboxId);
  }

  /** E2B's SandboxMetrics (host-side: the VMM's CPU, private memory, disk layers); one sample, now. */
  getMetrics(opts: { start?: Date; end?: Date } = {}): Promise<SandboxMetrics[]> {
    return metricsOf(this.t, this.sandboxId, opts);
  }

  /** A snapshot of this running sandbox (a forkd branch); it keeps running. */
  async createSnapshot(opts: { name?: string } = {}): Promise<SnapshotInfo> {
    const tag = opts.name ?? `${this.sandboxId}-snap-${randomBytes(3).toString("hex")}`;
    const r = await this.t.json<BranchResultWire>("POST", `/v1/sandboxes/${this.sandboxId}/branch`, {
      json: { tag, wait: true },
      timeoutMs: 0,
    });
    return { snapshotId: r.tag, names: [r.tag] };
  }

  /** The snapshots createSnapshot made of this sandbox. */
  listSnapshots(): Promise<SnapshotInfo[]> {
    return snapshotsOf(this.t, this.sandboxId);
  }

  deleteSnapshot(snapshotId: string): Promise<boolean> {
    return deleteSnap(this.t, snapshotId);
  }

  /**
   * E2B's fork of this running sandbox: one branch (a short pause; this sandbox keeps its id and
   * runs on) from which `count` sandboxes start. One entry per fork: a Sandbox, or the error that
   * fork failed with (each succeeds or fails on its own).
   */
  async fork(opts: { count?: number; timeoutMs?: number } = {}): Promise<Array<Sandbox | ForkdError>> {
    const count = opts.count ?? 1;
    const tag = `${this.sandboxId}-fork-${randomBytes(3).toString("hex")}`;
    await this.t.json("POST", `/v1/sandboxes/${this.sandboxId}/branch`, {
      json: { tag, wait: true },
      timeoutMs: 0,
    });
    let r: ForkResultWire;
    try {
      r = await this.t.json<ForkResultWire>("POST", "/v1/sandboxes", {
        json: {
          snapshot_tag: tag,
          n: count,
          ...(opts.timeoutMs !== undefined ? { deadline_ms: opts.timeoutMs } : {}),
          ...(Object.keys(this.#envs).length > 0 ? { env: this.#envs } : {}),
        },
        timeoutMs: 0,
      });
    } catch (e) {
      if (!(e instanceof ForkdError)) throw e;
      return Array.from({ length: count }, () => e); // every fork failed
    }
    const out: Array<Sandbox | ForkdError | undefined> = Array.from({ length: count }, () => undefined);
    for (const f of r.failures) out[f.index] = errorFromEnvelope(0, f.code, f.message);
    const ok = r.sandboxes[Symbol.iterator]();
    return out.map((x) => x ?? new Sandbox((ok.next().value as SandboxWire).id, this.t, this.#envs));
  }

  /**
   * E2B's setTimeout: the sandbox ends (lifecycle.onTimeout) `timeoutMs` from now, busy or idle
   * (null: never).
   */
  async setTimeout(timeoutMs: number | null): Promise<void> {
    await this.t.json("POST", `/v1/sandboxes/${this.sandboxId}/deadline`, {
      json: { deadline_ms: timeoutMs },
    });
  }

  /** forkd's idle timeout, counted from now (null: never): every API call resets it. */
  async setIdleTimeout(timeoutMs: number | null): Promise<void> {
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
    const ctx = opts.context;
    const language: string = opts.language ?? (ctx instanceof Context ? ctx.language : undefined) ?? "python";
    if (!(LANGUAGES as readonly string[]).includes(language)) {
      throw new InvalidArgumentError(`no ${language} kernel (known: ${LANGUAGES.join(", ")})`, {
        code: "invalid_argument",
      });
    }
    const timeoutMs = opts.timeoutMs ?? 60_000;
    const env = { ...this.#envs, ...opts.envs };
    const body: Record<string, unknown> = {
      code,
      timeout_ms: timeoutMs,
      ...(language !== "python" ? { language } : {}),
      ...(ctx !== undefined ? { context_id: ctx instanceof Context ? ctx.id : ctx } : {}),
      ...(Object.keys(env).length > 0 ? { env } : {}),
    };
    const streamed =
      (opts.onStdout || opts.onStderr) && this.#evalStream
        ? await this.#evalStreamed(body, opts, timeoutMs + 30_000)
        : null;
    const ex = executionOf(streamed ?? (await this.#eval(body, timeoutMs + 30_000)));
    if (!streamed) {
      for (const s of ex.logs.stdout) opts.onStdout?.(s);
      for (const s of ex.logs.stderr) opts.onStderr?.(s);
    }
    for (const r of ex.results) opts.onResult?.(r);
    if (ex.error) opts.onError?.(ex.error);
    return ex;
  }

  #evalStream = true;

  /** POST .../eval/stream: output to the callbacks as the cell runs; null from a daemon without it. */
  async #evalStreamed(
    body: Record<string, unknown>,
    opts: RunCodeOpts,
    timeoutMs: number,
  ): Promise<EvalResultWire | null> {
    let result: EvalResultWire | null = null;
    let failed: ForkdError | null = null;
    type Ev =
      | { type: "stdout"; text: string }
      | { type: "stderr"; text: string }
      | { type: "result"; result: EvalResultWire }
      | { type: "error"; error: { code: string; message: string; details?: Record<string, unknown> } };
    try {
      await this.t.ndjson<Ev>(
        "POST",
        `/v1/sandboxes/${this.sandboxId}/eval/stream`,
        (ev) => {
          if (ev.type === "stdout") opts.onStdout?.(ev.text);
          else if (ev.type === "stderr") opts.onStderr?.(ev.text);
          else if (ev.type === "result") result = ev.result;
          else if (ev.type === "error")
            failed = errorFromEnvelope(200, ev.error.code, ev.error.message, ev.error.details ?? {});
        },
        { json: body, timeoutMs },
      );
    } catch (e) {
      if (!(e instanceof NotFoundError) || !/route|Not Found/.test(e.message)) throw e;
      this.#evalStream = false; // a daemon without the route: the plain eval
      return null;
    }
    if (failed) throw failed as ForkdError;
    if (!result) throw new ForkdError("the eval stream ended without a result", { code: "connection" });
    return result;
  }

  async #eval(body: Record<string, unknown>, timeoutMs: number): Promise<EvalResultWire> {
    const path = `/v1/sandboxes/${this.sandboxId}/eval`;
    if (body.env === undefined || this.#cellEnv) {
      try {
        return await this.t.json<EvalResultWire>("POST", path, { json: body, timeoutMs });
      } catch (e) {
        if (
          body.env === undefined ||
          !(e instanceof InvalidArgumentError) ||
          !/env/.test(e.message + JSON.stringify(e.details))
        )
          throw e;
        this.#cellEnv = false; // a daemon whose eval takes no env yet
      }
    }
    // Such a daemon: the environment is set in the kernel (it then stays for later cells).
    const { env, ...rest } = body;
    const setup =
      rest.language === "javascript"
        ? `Object.assign(process.env, ${JSON.stringify(env)})`
        : `__import__('os').environ.update(${JSON.stringify(env)})`;
    await this.t.json("POST", path, {
      json: {
        code: setup,
        timeout_ms: 30_000,
        ...(rest.language !== undefined ? { language: rest.language } : {}),
        ...(rest.context_id !== undefined ? { context_id: rest.context_id } : {}),
      },
      timeoutMs: 60_000,
    });
    return this.t.json<EvalResultWire>("POST", path, { json: rest, timeoutMs });
  }

  /** A new interpreter context: its own globals (and cwd) in one language. */
  async createCodeContext(opts: { cwd?: string; language?: Language } = {}): Promise<Context> {
    return Context.of(
      await this.t.json<Record<string, unknown>>("POST", `/v1/sandboxes/${this.sandboxId}/contexts`, {
        json: { language: opts.language ?? "python", ...(opts.cwd ? { cwd: opts.cwd } : {}) },
      }),
    );
  }

  /** The contexts of a kernel (python by default), its default one included. */
  async listCodeContexts(opts: { language?: Language } = {}): Promise<Context[]> {
    const r = await this.t.json<{ contexts?: Array<Record<string, unknown>> }>(
      "GET",
      `/v1/sandboxes/${this.sandboxId}/contexts`,
      { query: { language: opts.language } },
    );
    return (r.contexts ?? []).map((c) => Context.of(c));
  }

  async removeCodeContext(context: Context | string): Promise<void> {
    const [id, query] = contextRef(context);
    await this.t.json("DELETE", `/v1/sandboxes/${this.sandboxId}/contexts/${q(id)}`, { query });
  }

  /** Forgets a context's globals and count (its id and cwd stay). */
  async restartCodeContext(context: Context | string): Promise<void> {
    const [id, query] = contextRef(context);
    await this.t.json("POST", `/v1/sandboxes/${this.sandboxId}/contexts/${q(id)}/restart`, { query });
  }
}

function contextRef(c: Context | string): [string, { language?: string }] {
  if (!(c instanceof Context)) return [c, {}];
  return [c.id, c.language !== "python" ? { language: c.language } : {}];
}

async function connectTo(t: Transport, id: string, timeoutMs?: number): Promise<string> {
  let w = await t.json<SandboxWire>("GET", `/v1/sandboxes/${q(id)}`);
  if (w.state === "paused")
    w = await t.json<SandboxWire>("POST", `/v1/sandboxes/${q(id)}/resume`, { timeoutMs: 0 });
  else if (w.state !== "running")
    throw new ConflictError(`sandbox ${id} is not running (${w.exit_reason ?? w.state})`, {
      code: "conflict",
      status: 409,
    });
  if (timeoutMs !== undefined)
    await t.json("POST", `/v1/sandboxes/${q(id)}/deadline`, { json: { deadline_ms: timeoutMs } });
  return w.id;
}

async function pauseIt(t: Transport, id: string): Promise<boolean> {
  const state = async () => (await t.json<SandboxWire>("GET", `/v1/sandboxes/${q(id)}`)).state;
  if ((await state()) === "paused") return false;
  try {
    await t.json("POST", `/v1/sandboxes/${q(id)}/pause`, { timeoutMs: 0 });
  } catch (e) {
    if (e instanceof ConflictError && (await state()) === "paused") return false;
    throw e;
  }
  return true;
}

async function metricsOf(
  t: Transport,
  id: string,
  o: { start?: Date; end?: Date },
): Promise<SandboxMetrics[]> {
  const r = await t.json<MetricsWire>("GET", `/v1/sandboxes/${q(id)}/metrics`, {
    query: { start: o.start?.toISOString(), end: o.end?.toISOString() },
  });
  return r.metrics.map((m) => ({
    timestamp: new Date(m.timestamp),
    cpuUsedPct: m.cpu_used_pct,
    cpuCount: m.cpu_count,
    memUsed: m.mem_used,
    memTotal: m.mem_total,
    memCache: 0,
    diskUsed: m.disk_used,
    diskTotal: m.disk_total,
  }));
}

async function snapshotsOf(t: Transport, sandboxId?: string): Promise<SnapshotInfo[]> {
  const r = await t.json<{ snapshots: Array<{ tag: string }> }>("GET", "/v1/snapshots");
  return r.snapshots
    .filter(
      (s) => !sandboxId || s.tag.startsWith(`${sandboxId}-snap-`) || s.tag.startsWith(`${sandboxId}-fork-`),
    )
    .map((s) => ({ snapshotId: s.tag, names: [s.tag] }));
}

async function deleteSnap(t: Transport, id: string): Promise<boolean> {
  try {
    await t.json("DELETE", `/v1/snapshots/${q(id)}`);
    return true;
  } catch (e) {
    if (e instanceof NotFoundError) return false;
    throw e;
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
      ...(opts.timeoutMs !== undefined ? { deadline_ms: opts.timeoutMs } : {}),
      ...(opts.idleTimeoutMs !== undefined ? { timeout_ms: opts.idleTimeoutMs } : {}),
      ...(opts.metadata ? { metadata: opts.metadata } : {}),
      ...(opts.onIdle ? { on_idle: opts.onIdle } : {}),
      ...(opts.lifecycle ? { on_deadline: onTimeoutOf(opts.lifecycle) } : {}),
      ...(opts.envs && Object.keys(opts.envs).length > 0 ? { env: opts.envs } : {}),
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
  const sandboxes = r.sandboxes.map((s) => new Sandbox(s.id, t, opts.envs));
  if (r.failures.length > 0) throw new ForkError(sandboxes, r.failures);
  return sandboxes;
}

function onTimeoutOf(l: SandboxOpts["lifecycle"]): "kill" | "pause" {
  const a = typeof l?.onTimeout === "object" ? l.onTimeout.action : (l?.onTimeout ?? "kill");
  if (a !== "kill" && a !== "pause")
    throw new InvalidArgumentError("lifecycle.onTimeout must be 'kill' or 'pause'", {
      code: "invalid_argument",
    });
  return a;
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
