/**
 * `ApiClient`: the daemon's REST API route by route, one method per route of docs/openapi.json,
 * wire shapes in and out (the generated types). `Sandbox` and `Controller` are the E2B-shaped
 * layer; this is the plain one, for tools that show the API as it is (the forkd CLI uses only
 * this). Every method takes `CallOpts`: an idle timeout and an abort signal.
 */
import type { IncomingMessage } from "node:http";
import type { components } from "./api.gen.js";
import { ForkdError, errorFromEnvelope } from "./errors.js";
import { Transport } from "./transport.js";
import type { ConnectionOpts, Query, RequestOpts } from "./transport.js";

type S = components["schemas"];
/** Every shape of the API by its schema name, as generated from docs/openapi.json. */
export type Wire = S;
type Progress<E> = Extract<E, { type: "progress" }>;
/** `K` of `T` optional. */
type Opt<T, K extends keyof T> = Omit<T, K> & Partial<Pick<T, K>>;

/**
 * Request bodies as a client may send them: the generated types make a field the daemon
 * defaults required (openapi-typescript reads `default` as "always there"); here it is optional.
 */
export interface Requests {
  CreateToken: Opt<S["CreateToken"], "scope">;
  CreateWebhook: S["CreateWebhook"];
  CreateSnapshot: Opt<
    S["CreateSnapshot"],
    "template" | "ready_timeout_ms" | "warm_eval_language" | "memory_mib" | "vcpus" | "nic"
  >;
  Push: Opt<S["Push"], "insecure">;
  Pull: Opt<S["Pull"], "insecure">;
  CreateSandboxes: Opt<S["CreateSandboxes"], "n" | "on_idle" | "on_deadline">;
  Branch: Opt<S["Branch"], "wait">;
  Exec: Opt<S["Exec"], "keep_stdin_open">;
  SendSignal: Opt<S["SendSignal"], "signal">;
  Eval: Opt<S["Eval"], "timeout_ms" | "language">;
  Mkdir: Opt<S["Mkdir"], "parents">;
}
type R = Requests;

/** The options of a Dockerfile build (POST /v1/snapshots/build's query). */
export interface BuildSnapshotOptions {
  tag: string;
  dockerfile?: string;
  build_args?: Record<string, string>;
  warm?: string;
  warm_eval?: string;
  /** The kernel warm_eval runs in (default python). */
  warm_eval_language?: "python" | "javascript";
  memory_mib?: number;
  vcpus?: number;
}

/** A snapshot creation's progress line: `message` always, structured fields when the daemon has them. */
export type SnapshotProgress = Progress<S["SnapshotProgressEvent"]>;
/** A push's or pull's progress line. */
export type TransferProgress = Progress<S["TransferProgressEvent"]>;

export interface CallOpts {
  /**
   * Idle timeout in ms (0: none). Default: the connection's requestTimeoutMs for a plain call;
   * none for a streamed one (exec output, progress), whose silences are the work's own.
   */
  timeoutMs?: number;
  /** Aborting it cuts the request and its reply; the call rejects with an AbortError. */
  signal?: AbortSignal;
}

export interface StreamOpts<P> extends CallOpts {
  onProgress?: (ev: P) => void;
}

const seg = encodeURIComponent;

export class ApiClient {
  private readonly t: Transport;

  constructor(opts: ConnectionOpts = {}) {
    this.t = new Transport(opts);
  }

  /** Where requests go, for messages ("unix:/path" or the URL's origin). */
  get where(): string {
    return this.t.where;
  }

  #call<T>(method: string, path: string, o: CallOpts, extra: RequestOpts = {}): Promise<T> {
    return this.t.json<T>(method, path, { ...extra, ...callOpts(o) });
  }

  /** An NDJSON progress stream: progress lines to `onProgress`, then the `key` of "done", or the error. */
  async #progress<T, P>(
    path: string,
    body: unknown,
    key: string,
    o: StreamOpts<P>,
    extra: RequestOpts = { json: body },
  ): Promise<T> {
    let result: { value: T } | null = null;
    let failed: ForkdError | null = null;
    await this.t.ndjson<{ type: string; error?: S["Error"]["error"] } & Record<string, unknown>>(
      "POST",
      path,
      (ev) => {
        if (ev.type === "progress") o.onProgress?.(ev as P);
        else if (ev.type === "done") result = { value: ev[key] as T };
        else if (ev.type === "error" && ev.error)
          failed = errorFromEnvelope(0, ev.error.code, ev.error.message, ev.error.details);
      },
      { ...extra, query: { ...extra.query, stream: 1 }, ...callOpts(o) },
    );
    if (failed) throw failed as ForkdError;
    const r = result as { value: T } | null;
    if (!r) throw new ForkdError("the daemon ended the stream without a result", { code: "connection" });
    return r.value;
  }

  // --- the daemon ---

  health(o: CallOpts = {}): Promise<S["Health"]> {
    return this.#call("GET", "/v1/health", o);
  }
  version(o: CallOpts = {}): Promise<S["Version"]> {
    return this.#call("GET", "/v1/version", o);
  }
  /** The OpenAPI document of the daemon that answers. */
  openapi(o: CallOpts = {}): Promise<Record<string, unknown>> {
    return this.#call("GET", "/v1/openapi.json", o);
  }
  /** Prometheus text (admins). */
  async metrics(o: CallOpts = {}): Promise<string> {
    return (await this.t.bytes("GET", "/metrics", callOpts(o))).toString("utf8");
  }

  // --- tokens (admins) ---

  listTokens(o: CallOpts = {}): Promise<S["TokenList"]> {
    return this.#call("GET", "/v1/tokens", o);
  }
  createToken(body: R["CreateToken"], o: CallOpts = {}): Promise<S["TokenCreated"]> {
    return this.#call("POST", "/v1/tokens", o, { json: body });
  }
  revokeToken(id: string, o: CallOpts = {}): Promise<S["Token"]> {
    return this.#call("DELETE", `/v1/tokens/${seg(id)}`, o);
  }

  // --- lifecycle webhooks (a tenant's own; an admin's operator-wide) ---

  listWebhooks(o: CallOpts = {}): Promise<S["WebhookList"]> {
    return this.#call("GET", "/v1/webhooks", o);
  }
  /** The reply is the only place the webhook's secret is shown (verify deliveries with verifyWebhook). */
  createWebhook(body: R["CreateWebhook"], o: CallOpts = {}): Promise<S["WebhookCreated"]> {
    return this.#call("POST", "/v1/webhooks", o, { json: body });
  }
  getWebhook(id: string, o: CallOpts = {}): Promise<S["Webhook"]> {
    return this.#call("GET", `/v1/webhooks/${seg(id)}`, o);
  }
  deleteWebhook(id: string, o: CallOpts = {}): Promise<S["Webhook"]> {
    return this.#call("DELETE", `/v1/webhooks/${seg(id)}`, o);
  }

  // --- snapshots ---

  listSnapshots(o: CallOpts = {}): Promise<S["SnapshotList"]> {
    return this.#call("GET", "/v1/snapshots", o);
  }
  getSnapshot(tag: string, o: CallOpts = {}): Promise<S["SnapshotOrStatus"]> {
    return this.#call("GET", `/v1/snapshots/${seg(tag)}`, o);
  }
  snapshotInfo(tag: string, o: CallOpts = {}): Promise<S["SnapshotInfo"]> {
    return this.#call("GET", `/v1/snapshots/${seg(tag)}/info`, o);
  }
  /** Boots, warms and freezes a parent; its progress streams to `onProgress`. */
  createSnapshot(body: R["CreateSnapshot"], o: StreamOpts<SnapshotProgress> = {}): Promise<S["Snapshot"]> {
    return this.#progress("/v1/snapshots", body, "snapshot", o);
  }
  /**
   * Builds a snapshot from a Dockerfile: `context` is the build context as a tar (bytes or a
   * stream, sent as it is read) holding the Dockerfile at `options.dockerfile` (default
   * "Dockerfile"); each RUN/COPY/ADD step is a cached layer in the daemon. Progress lines carry
   * each step and its output (docs/images.md, "Dockerfiles").
   */
  buildSnapshot(
    options: BuildSnapshotOptions,
    context: Uint8Array | NodeJS.ReadableStream,
    o: StreamOpts<SnapshotProgress> = {},
  ): Promise<S["Snapshot"]> {
    const { build_args, ...rest } = options;
    const query: Query = { ...rest, ...(build_args ? { build_args: JSON.stringify(build_args) } : {}) };
    return this.#progress("/v1/snapshots/build", null, "snapshot", o, { body: context, query });
  }
  /**
   * Deletes a snapshot (409 while sandboxes run from it, or while branches stack on it). With
   * `cascade` the branches stacked on it go too; with `force` each is flattened so that it no
   * longer needs it (see docs/api.md).
   */
  deleteSnapshot(
    tag: string,
    flags: { cascade?: boolean; force?: boolean } = {},
    o: CallOpts = {},
  ): Promise<S["Deleted"]> {
    return this.#call("DELETE", `/v1/snapshots/${seg(tag)}`, o, {
      query: { ...(flags.cascade ? { cascade: 1 } : {}), ...(flags.force ? { force: 1 } : {}) },
    });
  }
  compactSnapshot(tag: string, body: S["Compact"], o: CallOpts = {}): Promise<S["Snapshot"]> {
    return this.#call("POST", `/v1/snapshots/${seg(tag)}/compact`, o, { json: body });
  }
  /** The snapshot's pack (tar.zst), as a stream of bytes read at the caller's pace. */
  pack(tag: string, o: CallOpts = {}): Promise<IncomingMessage> {
    return this.t.send("GET", `/v1/snapshots/${seg(tag)}/pack`, callOpts(o));
  }
  /** Registers the snapshot in a pack, sent as it is read. */
  unpack(pack: Uint8Array | NodeJS.ReadableStream, o: CallOpts = {}): Promise<S["Unpacked"]> {
    return this.#call("POST", "/v1/snapshots/unpack", o, { body: pack });
  }
  push(tag: string, body: R["Push"], o: StreamOpts<TransferProgress> = {}): Promise<S["Pushed"]> {
    return this.#progress(`/v1/snapshots/${seg(tag)}/push`, body, "result", o);
  }
  pull(body: R["Pull"], o: StreamOpts<TransferProgress> = {}): Promise<S["Pulled"]> {
    return this.#progress("/v1/snapshots/pull", body, "result", o);
  }

  // --- sandboxes ---

  listSandboxes(o: CallOpts = {}): Promise<S["SandboxList"]> {
    return this.#call("GET", "/v1/sandboxes", o);
  }
  /** Forks `body.n` children; the ones that failed are in `failures` (not thrown). */
  fork(body: R["CreateSandboxes"], o: CallOpts = {}): Promise<S["ForkResult"]> {
    return this.#call("POST", "/v1/sandboxes", o, { json: body });
  }
  getSandbox(id: string, o: CallOpts = {}): Promise<S["Sandbox"]> {
    return this.#call("GET", `/v1/sandboxes/${seg(id)}`, o);
  }
  kill(id: string, o: CallOpts = {}): Promise<S["Deleted"]> {
    return this.#call("DELETE", `/v1/sandboxes/${seg(id)}`, o);
  }
  pause(id: string, o: CallOpts = {}): Promise<S["Sandbox"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/pause`, o);
  }
  resume(id: string, o: CallOpts = {}): Promise<S["Sandbox"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/resume`, o);
  }
  setTimeout(id: string, body: S["SetTimeout"], o: CallOpts = {}): Promise<S["Sandbox"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/timeout`, o, { json: body });
  }
  expose(id: string, body: S["ExposePort"], o: CallOpts = {}): Promise<S["Sandbox"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/ports`, o, { json: body });
  }
  unexpose(id: string, port: number, o: CallOpts = {}): Promise<S["Sandbox"]> {
    return this.#call("DELETE", `/v1/sandboxes/${seg(id)}/ports/${port}`, o);
  }
  setEgress(id: string, body: S["EgressRequest"], o: CallOpts = {}): Promise<S["Sandbox"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/egress`, o, { json: body });
  }
  branch(id: string, body: R["Branch"], o: CallOpts = {}): Promise<S["BranchResult"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/branch`, o, { json: body });
  }

  // --- commands and code ---

  exec(id: string, body: R["Exec"], o: CallOpts = {}): Promise<S["ExecResult"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/exec`, o, { json: body });
  }
  /** Runs a command, each output chunk, its exit (or an error) to `onEvent` as it comes. */
  execStream(
    id: string,
    body: R["Exec"],
    onEvent: (ev: S["ExecEvent"]) => void,
    o: CallOpts = {},
  ): Promise<void> {
    return this.t.ndjson("POST", `/v1/sandboxes/${seg(id)}/exec/stream`, onEvent, {
      json: body,
      ...callOpts(o),
    });
  }
  listCommands(id: string, o: CallOpts = {}): Promise<S["CommandList"]> {
    return this.#call("GET", `/v1/sandboxes/${seg(id)}/commands`, o);
  }
  signal(id: string, pid: number, body: R["SendSignal"], o: CallOpts = {}): Promise<S["Command"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/commands/${pid}/signal`, o, { json: body });
  }
  /** Writes to a command's stdin (opened with keep_stdin_open); `eof` closes it after. */
  sendStdin(
    id: string,
    pid: number,
    data: Uint8Array | NodeJS.ReadableStream,
    flags: { eof?: boolean } = {},
    o: CallOpts = {},
  ): Promise<S["Command"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/commands/${pid}/stdin`, o, {
      body: data,
      query: flags.eof ? { eof: 1 } : {},
    });
  }
  eval(id: string, body: R["Eval"], o: CallOpts = {}): Promise<S["EvalResult"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/eval`, o, { json: body });
  }

  // --- files ---

  /** A guest file's bytes, as a stream read at the caller's pace. */
  readFile(id: string, path: string, o: CallOpts = {}): Promise<IncomingMessage> {
    return this.t.send("GET", `/v1/sandboxes/${seg(id)}/files`, { query: { path }, ...callOpts(o) });
  }
  /** Writes a guest file (replaced atomically), sent as `data` is read. */
  writeFile(
    id: string,
    path: string,
    data: Uint8Array | NodeJS.ReadableStream,
    flags: { mode?: number; parents?: boolean } = {},
    o: CallOpts = {},
  ): Promise<S["FileWritten"]> {
    return this.#call("PUT", `/v1/sandboxes/${seg(id)}/files`, o, {
      body: data,
      query: {
        path,
        ...(flags.mode !== undefined ? { mode: flags.mode } : {}),
        ...(flags.parents ? { parents: 1 } : {}),
      },
    });
  }
  removeFile(
    id: string,
    path: string,
    flags: { recursive?: boolean } = {},
    o: CallOpts = {},
  ): Promise<S["Deleted"]> {
    return this.#call("DELETE", `/v1/sandboxes/${seg(id)}/files`, o, {
      query: { path, ...(flags.recursive ? { recursive: 1 } : {}) },
    });
  }
  statFile(id: string, path: string, o: CallOpts = {}): Promise<S["FileStat"]> {
    return this.#call("GET", `/v1/sandboxes/${seg(id)}/files/stat`, o, { query: { path } });
  }
  listDir(id: string, path: string, o: CallOpts = {}): Promise<S["DirList"]> {
    return this.#call("GET", `/v1/sandboxes/${seg(id)}/files/list`, o, { query: { path } });
  }
  mkdir(id: string, body: R["Mkdir"], o: CallOpts = {}): Promise<S["PathResult"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/files/mkdir`, o, { json: body });
  }
  rename(id: string, body: S["Rename"], o: CallOpts = {}): Promise<S["Renamed"]> {
    return this.#call("POST", `/v1/sandboxes/${seg(id)}/files/rename`, o, { json: body });
  }
}

function callOpts(o: CallOpts): Pick<RequestOpts, "timeoutMs" | "signal"> {
  return {
    ...(o.timeoutMs !== undefined ? { timeoutMs: o.timeoutMs } : {}),
    ...(o.signal ? { signal: o.signal } : {}),
  };
}
