/**
 * Every route of the REST API, described once: method, path, parameters, body and responses.
 * The OpenAPI document is generated from this table, and a unit test checks that the Hono app
 * serves exactly these routes, so neither can drift from the other.
 */
import { z } from "zod";
import * as S from "./schemas.js";

export type Method = "get" | "post" | "put" | "delete";

/** A response or request body: JSON, newline-delimited JSON events, raw bytes, or text. */
export type Body =
  | { kind: "json"; schema: z.ZodType }
  | { kind: "ndjson"; event: z.ZodType }
  | { kind: "bytes"; headers?: Record<string, string> }
  | { kind: "text"; contentType: string };

/** Which bound applies to a request body (sizes in src/app/body-limits.ts, BodyLimits). */
export type BodyLimit = "json" | "code" | "stdin" | "upload" | "pack";

export interface RouteSpec {
  operationId: string;
  method: Method;
  /** OpenAPI style: /v1/sandboxes/{id} */
  path: string;
  summary: string;
  tag: "daemon" | "access" | "webhooks" | "snapshots" | "sandboxes" | "commands" | "code" | "files";
  /** No bearer token needed (TCP listeners). */
  public?: boolean;
  /** Admin callers only (the unix socket, FORKD_TOKEN, admin-scoped tokens): 403 for tenants. */
  admin?: boolean;
  /** Starts or stops VMs or writes snapshots: counts against the per-caller heavy limit. */
  heavy?: boolean;
  /** The body's bound; JSON bodies default to "json". */
  limit?: BodyLimit;
  query?: z.ZodObject;
  body?: Body;
  responses: Partial<Record<200 | 201 | 202, Body>>;
  /** With ?stream=1 the success reply is instead NDJSON lines of this event. */
  streamed?: z.ZodType;
}

const json = (schema: z.ZodType): Body => ({ kind: "json", schema });
const ndjson = (event: z.ZodType): Body => ({ kind: "ndjson", event });
const bytes: Body = { kind: "bytes" };

const SB = "/v1/sandboxes/{id}";

export const ROUTES: RouteSpec[] = [
  {
    operationId: "health",
    method: "get",
    path: "/v1/health",
    summary: "Liveness, accelerator and pool state",
    tag: "daemon",
    public: true,
    responses: { 200: json(S.Health) },
  },
  {
    operationId: "version",
    method: "get",
    path: "/v1/version",
    summary: "Daemon, API and QEMU versions",
    tag: "daemon",
    responses: { 200: json(S.Version) },
  },
  {
    operationId: "openapi",
    method: "get",
    path: "/v1/openapi.json",
    summary: "This document",
    tag: "daemon",
    public: true,
    responses: { 200: json(z.record(z.string(), z.unknown())) },
  },
  {
    operationId: "metrics",
    method: "get",
    path: "/metrics",
    summary: "Prometheus metrics (text exposition format 0.0.4); admin callers only",
    tag: "daemon",
    admin: true,
    responses: { 200: { kind: "text", contentType: "text/plain; version=0.0.4" } },
  },
  {
    operationId: "listNodes",
    method: "get",
    path: "/v1/nodes",
    summary:
      "A cluster's nodes (a gateway's; docs/cluster.md): addresses, machine, capacity, load, the snapshots " +
      "each holds; admin callers only. A daemon (alone, or a cluster's node) answers 404.",
    tag: "daemon",
    admin: true,
    responses: { 200: json(S.NodeList) },
  },
  {
    operationId: "listTokens",
    method: "get",
    path: "/v1/tokens",
    summary: "API tokens (never their secrets); admin callers only",
    tag: "access",
    admin: true,
    responses: { 200: json(S.TokenList) },
  },
  {
    operationId: "createToken",
    method: "post",
    path: "/v1/tokens",
    summary: "Create an API token for a tenant; the reply is the only place its secret is shown",
    tag: "access",
    admin: true,
    body: json(S.CreateToken),
    responses: { 201: json(S.TokenCreated) },
  },
  {
    operationId: "revokeToken",
    method: "delete",
    path: "/v1/tokens/{token_id}",
    summary: "Revoke an API token: it is refused from the next request on",
    tag: "access",
    admin: true,
    responses: { 200: json(S.Token) },
  },
  {
    operationId: "listWebhooks",
    method: "get",
    path: "/v1/webhooks",
    summary:
      "Lifecycle webhooks (never their secrets) with their delivery state: a tenant's own; an admin's, every one",
    tag: "webhooks",
    responses: { 200: json(S.WebhookList) },
  },
  {
    operationId: "createWebhook",
    method: "post",
    path: "/v1/webhooks",
    summary:
      "Register a URL that receives signed lifecycle events (docs/webhooks.md): a tenant's is told of its own " +
      "sandboxes, an admin's of every one. The reply is the only place its secret is shown",
    tag: "webhooks",
    body: json(S.CreateWebhook),
    responses: { 201: json(S.WebhookCreated) },
  },
  {
    operationId: "getWebhook",
    method: "get",
    path: "/v1/webhooks/{webhook_id}",
    summary: "One webhook and its delivery state (another tenant's is 404)",
    tag: "webhooks",
    responses: { 200: json(S.Webhook) },
  },
  {
    operationId: "deleteWebhook",
    method: "delete",
    path: "/v1/webhooks/{webhook_id}",
    summary: "Delete a webhook: nothing more is sent to it, its undelivered events are dropped",
    tag: "webhooks",
    responses: { 200: json(S.Webhook) },
  },
  {
    operationId: "listSnapshots",
    method: "get",
    path: "/v1/snapshots",
    summary: "List snapshots",
    tag: "snapshots",
    responses: { 200: json(S.SnapshotList) },
  },
  {
    operationId: "createSnapshot",
    method: "post",
    path: "/v1/snapshots",
    summary:
      "Boot a parent VM, warm it and freeze it into a snapshot. With ?stream=1 the reply is NDJSON progress.",
    tag: "snapshots",
    query: z.object({ stream: z.enum(["0", "1"]).optional() }),
    body: json(S.CreateSnapshot),
    heavy: true,
    limit: "code",
    responses: { 201: json(S.Snapshot) },
    streamed: S.SnapshotProgressEvent,
  },
  {
    operationId: "buildSnapshot",
    method: "post",
    path: "/v1/snapshots/build",
    summary:
      "Build a guest image from a Dockerfile (the body: the build context as a tar; each step a cached layer), " +
      "then snapshot it like createSnapshot. With ?stream=1 the reply is NDJSON progress.",
    tag: "snapshots",
    query: S.BuildSnapshotQuery,
    body: { kind: "bytes", headers: { "content-type": "application/x-tar" } },
    heavy: true,
    limit: "upload",
    responses: { 201: json(S.Snapshot) },
    streamed: S.SnapshotProgressEvent,
  },
  {
    operationId: "getSnapshot",
    method: "get",
    path: "/v1/snapshots/{tag}",
    summary: "One snapshot's metadata, or its status while it is being written or after it failed",
    tag: "snapshots",
    responses: { 200: json(S.SnapshotOrStatus) },
  },
  {
    operationId: "snapshotInfo",
    method: "get",
    path: "/v1/snapshots/{tag}/info",
    summary: "A snapshot's chain (depth, ancestors, dependents) and sizes",
    tag: "snapshots",
    responses: { 200: json(S.SnapshotInfo) },
  },
  {
    operationId: "compactSnapshot",
    method: "post",
    path: "/v1/snapshots/{tag}/compact",
    summary: "Flatten a chain: a new base snapshot with this one's state and no parent",
    tag: "snapshots",
    body: json(S.Compact),
    heavy: true,
    responses: { 201: json(S.Snapshot) },
  },
  {
    operationId: "packSnapshot",
    method: "get",
    path: "/v1/snapshots/{tag}/pack",
    summary:
      "The snapshot as a pack (tar + zstd): its chain, disk layers and guest image, with a manifest of sha256 sums",
    tag: "snapshots",
    responses: { 200: bytes },
  },
  {
    operationId: "unpackSnapshot",
    method: "post",
    path: "/v1/snapshots/unpack",
    summary:
      "Register the snapshot in a pack (the body): verified before anything is registered; all or nothing",
    tag: "snapshots",
    body: bytes,
    heavy: true,
    limit: "pack",
    responses: { 201: json(S.Unpacked) },
  },
  {
    operationId: "pushSnapshot",
    method: "post",
    path: "/v1/snapshots/{tag}/push",
    summary:
      "Push the snapshot (its chain, disk layers and guest image) to an OCI registry as an artifact; only blobs " +
      "the repository lacks are uploaded. With ?stream=1 the reply is NDJSON progress (TransferProgressEvent).",
    // The daemon's registry credentials and network are the operator's: not for tenants.
    admin: true,
    heavy: true,
    tag: "snapshots",
    query: z.object({ stream: z.enum(["0", "1"]).optional() }),
    body: json(S.Push),
    responses: { 200: json(S.Pushed) },
    streamed: S.TransferProgressEvent,
  },
  {
    operationId: "pullSnapshot",
    method: "post",
    path: "/v1/snapshots/pull",
    summary:
      "Pull a snapshot from an OCI registry (ref), a pack file (url) or a peer node of the cluster (peer, with " +
      "the key as tag: only what this node lacks, under the same keys and owners): verified before anything is " +
      "registered; all or nothing. With ?stream=1 the reply is NDJSON progress (TransferProgressEvent).",
    // The daemon's registry credentials and network are the operator's: not for tenants.
    admin: true,
    heavy: true,
    tag: "snapshots",
    query: z.object({ stream: z.enum(["0", "1"]).optional() }),
    body: json(S.Pull),
    responses: { 201: json(S.Pulled) },
    streamed: S.TransferProgressEvent,
  },
  {
    operationId: "deleteSnapshot",
    method: "delete",
    path: "/v1/snapshots/{tag}",
    summary:
      "Delete a snapshot. 409 while sandboxes run from it, or while branches stack on it unless ?cascade=1 " +
      "(delete them too) or ?force=1 (flatten them so they no longer need it); ?dry_run=1 only says what " +
      "it would remove (DeletePlan)",
    tag: "snapshots",
    query: S.DeleteSnapshotQuery,
    heavy: true,
    responses: { 200: json(z.union([S.Deleted, S.DeletePlan])) },
  },
  {
    operationId: "listSandboxes",
    method: "get",
    path: "/v1/sandboxes",
    summary: "List sandboxes (filtered by state and metadata, paged by limit and next_token)",
    tag: "sandboxes",
    query: S.ListSandboxesQuery,
    responses: { 200: json(S.SandboxList) },
  },
  {
    operationId: "createSandboxes",
    method: "post",
    path: "/v1/sandboxes",
    summary: "Fork n children of a snapshot; returns when every child answers (or failed)",
    tag: "sandboxes",
    body: json(S.CreateSandboxes),
    heavy: true,
    responses: { 201: json(S.ForkResult) },
  },
  {
    operationId: "getSandbox",
    method: "get",
    path: SB,
    summary: "One sandbox",
    tag: "sandboxes",
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "sandboxMetrics",
    method: "get",
    path: `${SB}/metrics`,
    summary: "Host-side usage of the sandbox's VM (CPU, memory, disk), in E2B's metrics shape",
    tag: "sandboxes",
    query: S.MetricsQuery,
    responses: { 200: json(S.SandboxMetrics) },
  },
  {
    operationId: "deleteSandbox",
    method: "delete",
    path: SB,
    summary: "Kill a sandbox and delete its files",
    tag: "sandboxes",
    heavy: true,
    responses: { 200: json(S.Deleted) },
  },
  {
    operationId: "pauseSandbox",
    method: "post",
    path: `${SB}/pause`,
    summary: "Save the sandbox's whole state to disk and stop its VMM (frees its memory)",
    tag: "sandboxes",
    heavy: true,
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "resumeSandbox",
    method: "post",
    path: `${SB}/resume`,
    summary: "Bring a paused sandbox back: same id, files and processes",
    tag: "sandboxes",
    heavy: true,
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "setSandboxTimeout",
    method: "post",
    path: `${SB}/timeout`,
    summary: "Set (or clear) the idle timeout, counted from now",
    tag: "sandboxes",
    body: json(S.SetTimeout),
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "setSandboxDeadline",
    method: "post",
    path: `${SB}/deadline`,
    summary: "Set (or clear) the absolute deadline (E2B's timeout), counted from now",
    tag: "sandboxes",
    body: json(S.SetDeadline),
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "exposePort",
    method: "post",
    path: `${SB}/ports`,
    summary:
      "Expose a guest TCP port of a running sandbox on the host (network user or netns); network.ports in the view says where it answers",
    tag: "sandboxes",
    body: json(S.ExposePort),
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "unexposePort",
    method: "delete",
    path: `${SB}/ports/{port}`,
    summary: "Stop exposing a guest TCP port on the host (not exposed: nothing changes)",
    tag: "sandboxes",
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "setSandboxEgress",
    method: "post",
    path: `${SB}/egress`,
    summary:
      "Replace a running sandbox's egress policy (network netns, or user created with egress allow or list); flows the old policy let through are checked again",
    tag: "sandboxes",
    body: json(S.EgressRequest),
    responses: { 200: json(S.Sandbox) },
  },
  {
    operationId: "branchSandbox",
    method: "post",
    path: `${SB}/branch`,
    summary:
      "Snapshot a running sandbox (memory, disk, processes) with a short pause; fork the new tag to try several next steps",
    tag: "sandboxes",
    body: json(S.Branch),
    heavy: true,
    responses: { 201: json(S.BranchResult), 202: json(S.BranchResult) },
  },
  {
    operationId: "exec",
    method: "post",
    path: `${SB}/exec`,
    summary: "Run a command and return its buffered output (16 MiB per stream at most)",
    tag: "commands",
    body: json(S.Exec),
    limit: "code",
    responses: { 200: json(S.ExecResult) },
  },
  {
    operationId: "execStream",
    method: "post",
    path: `${SB}/exec/stream`,
    summary: "Run a command, streaming its output as NDJSON events as it comes",
    tag: "commands",
    body: json(S.Exec),
    limit: "code",
    responses: { 200: ndjson(S.ExecEvent) },
  },
  {
    operationId: "listCommands",
    method: "get",
    path: `${SB}/commands`,
    summary: "Commands the sandbox runs (REST exec, the terminal, E2B envd) that are still running",
    tag: "commands",
    responses: { 200: json(S.CommandList) },
  },
  {
    operationId: "commandHistory",
    method: "get",
    path: `${SB}/commands/history`,
    summary: "The last 256 commands (any door) that have ended, with their exit",
    tag: "commands",
    responses: { 200: json(S.CommandHistory) },
  },
  {
    operationId: "attachCommand",
    method: "get",
    path: `${SB}/commands/{pid}/stream`,
    summary:
      "Attach to a running command's output (from now on) and its exit, as exec/stream's NDJSON events; hanging up detaches only this reader",
    tag: "commands",
    responses: { 200: ndjson(S.ExecEvent) },
  },
  {
    operationId: "signalCommand",
    method: "post",
    path: `${SB}/commands/{pid}/signal`,
    summary: "Send a signal to a running command's process group",
    tag: "commands",
    body: json(S.SendSignal),
    responses: { 200: json(S.Command) },
  },
  {
    operationId: "writeCommandStdin",
    method: "post",
    path: `${SB}/commands/{pid}/stdin`,
    summary: "Write the body to a running command's standard input; ?eof=1 closes it afterwards",
    tag: "commands",
    query: S.StdinQuery,
    body: bytes,
    limit: "stdin",
    responses: { 200: json(S.Command) },
  },
  {
    operationId: "resizeCommand",
    method: "post",
    path: `${SB}/commands/{pid}/resize`,
    summary: "Change the terminal size of a command started with `pty` (it gets SIGWINCH)",
    tag: "commands",
    body: json(S.PtySize),
    responses: { 200: json(S.Command) },
  },
  {
    operationId: "eval",
    method: "post",
    path: `${SB}/eval`,
    summary: "Run a cell in the sandbox's warm Python interpreter",
    tag: "code",
    body: json(S.Eval),
    limit: "code",
    responses: { 200: json(S.EvalResult) },
  },
  {
    operationId: "evalStream",
    method: "post",
    path: `${SB}/eval/stream`,
    summary: "Run a cell, streaming its stdout and stderr as NDJSON events while it runs, then its result",
    tag: "code",
    body: json(S.Eval),
    limit: "code",
    responses: { 200: ndjson(S.EvalEvent) },
  },
  {
    operationId: "createContext",
    method: "post",
    path: `${SB}/contexts`,
    summary: "Create a code context in a kernel: its own globals, execution count and cwd",
    tag: "code",
    body: json(S.CreateContext),
    responses: { 200: json(S.CodeContext) },
  },
  {
    operationId: "listContexts",
    method: "get",
    path: `${SB}/contexts`,
    summary: "The code contexts of a kernel (its default one included)",
    tag: "code",
    query: S.ContextQuery,
    responses: { 200: json(z.object({ contexts: z.array(S.CodeContext) })) },
  },
  {
    operationId: "deleteContext",
    method: "delete",
    path: `${SB}/contexts/{context}`,
    summary: "Delete a code context (not the default one)",
    tag: "code",
    query: S.ContextQuery,
    responses: { 200: json(S.CodeContext) },
  },
  {
    operationId: "restartContext",
    method: "post",
    path: `${SB}/contexts/{context}/restart`,
    summary: "Restart a code context: its globals emptied, its count back to 0, its cwd kept",
    tag: "code",
    query: S.ContextQuery,
    responses: { 200: json(S.CodeContext) },
  },
  {
    operationId: "readFile",
    method: "get",
    path: `${SB}/files`,
    summary: "Download a file (streamed bytes)",
    tag: "files",
    query: S.PathQuery,
    responses: { 200: { kind: "bytes", headers: { "x-forkd-file-size": "The file's size in bytes" } } },
  },
  {
    operationId: "writeFile",
    method: "put",
    path: `${SB}/files`,
    summary:
      "Upload a file (streamed bytes, replaced atomically; Content-Encoding: gzip is decompressed, the upload bound applying to the decompressed bytes)",
    tag: "files",
    query: S.WriteQuery,
    body: bytes,
    limit: "upload",
    responses: { 201: json(S.FileWritten) },
  },
  {
    operationId: "removeFile",
    method: "delete",
    path: `${SB}/files`,
    summary: "Remove a file or directory",
    tag: "files",
    query: S.RemoveQuery,
    responses: { 200: json(S.Deleted) },
  },
  {
    operationId: "statFile",
    method: "get",
    path: `${SB}/files/stat`,
    summary: "Stat a path",
    tag: "files",
    query: S.PathQuery,
    responses: { 200: json(S.FileStat) },
  },
  {
    operationId: "listDir",
    method: "get",
    path: `${SB}/files/list`,
    summary: "List a directory",
    tag: "files",
    query: S.PathQuery,
    responses: { 200: json(S.DirList) },
  },
  {
    operationId: "makeDir",
    method: "post",
    path: `${SB}/files/mkdir`,
    summary: "Create a directory",
    tag: "files",
    body: json(S.Mkdir),
    responses: { 201: json(S.PathResult) },
  },
  {
    operationId: "watchDir",
    method: "get",
    path: `${SB}/files/watch`,
    summary:
      "Watch a directory (?recursive=1: and every directory under it, also those made later): NDJSON lines until the client hangs up",
    tag: "files",
    query: S.WatchQuery,
    responses: { 200: ndjson(S.WatchLine) },
  },
  {
    operationId: "renameFile",
    method: "post",
    path: `${SB}/files/rename`,
    summary: "Rename a file or directory",
    tag: "files",
    body: json(S.Rename),
    responses: { 200: json(S.Renamed) },
  },
  {
    operationId: "events",
    method: "get",
    path: "/v1/events",
    summary:
      "Server-sent events of the caller's sandboxes and snapshots: `state` first ({sandboxes, snapshots, " +
      "pending}: the views of GET /v1/sandboxes and GET /v1/snapshots), then `sandbox` (a Sandbox, on creation " +
      "and each state change), `sandbox-gone` ({id, exit_reason}), `snapshot` (a Snapshot or SnapshotStatus), " +
      "`snapshot-gone` ({tag}), `usage` every 2 s ({sandboxes: {ID: {cpu_percent, memory_bytes}}}) and a " +
      "`: ping` comment every 15 s; a client that falls 4 MiB behind is disconnected (reconnect: `state` again)",
    tag: "daemon",
    responses: { 200: { kind: "text", contentType: "text/event-stream" } },
  },
  {
    operationId: "audit",
    method: "get",
    path: "/v1/audit",
    summary:
      "Audit lines that named a sandbox (?sandbox=ID) or a snapshot (?snapshot=TAG), newest last; " +
      "a tenant sees only its own",
    tag: "access",
    query: S.AuditQuery,
    responses: { 200: json(S.AuditLines) },
  },
  {
    operationId: "consoleSession",
    method: "get",
    path: "/v1/console/session",
    summary: "Who the web console is logged in as (401: nobody; the unix socket: the local admin)",
    tag: "access",
    public: true,
    responses: { 200: json(S.ConsoleCaller) },
  },
  {
    operationId: "consoleLogin",
    method: "post",
    path: "/v1/console/session",
    summary:
      "Log the web console in (TCP listener): the token is checked like a bearer token; the reply sets " +
      "the session cookie `forkd_console` (HttpOnly, SameSite=Strict) and gives the page the session's " +
      "`key`, which every call must send as `X-Forkd-Console-Key` (the cookie alone opens nothing); " +
      "valid while the token is",
    tag: "access",
    public: true,
    body: json(S.ConsoleLogin),
    responses: { 200: json(S.ConsoleLoggedIn) },
  },
  {
    operationId: "consoleTicket",
    method: "post",
    path: "/v1/console/ticket",
    summary:
      "A single-use ticket (60 s) for the console session of the cookie and key sent: a GET or a WebSocket " +
      "upgrade may bring it as `?console_ticket=` instead of the key (EventSource, WebSocket and download " +
      "links cannot send a header)",
    tag: "access",
    responses: { 200: json(S.ConsoleTicket) },
  },
  {
    operationId: "consoleLogout",
    method: "delete",
    path: "/v1/console/session",
    summary: "Log the web console out (ends the session of the cookie and key sent)",
    tag: "access",
    public: true,
    responses: { 200: json(z.object({ ok: z.literal(true) })) },
  },
  {
    operationId: "sandboxConsole",
    method: "get",
    path: `${SB}/console`,
    summary: "The tail of the sandbox VM's serial console log (default 64 KiB, at most 1 MiB)",
    tag: "sandboxes",
    query: S.ConsoleTailQuery,
    responses: { 200: { kind: "text", contentType: "text/plain" } },
  },
  {
    operationId: "terminal",
    method: "get",
    path: `${SB}/terminal`,
    summary:
      "A WebSocket (101) to a PTY command in the guest (default /bin/bash -l, else /bin/sh): binary frames " +
      "are the terminal's bytes both ways; a text frame from the client is JSON control " +
      '({"type":"resize","rows","cols"}); the server ends with the text frame {"type":"exit","exit_code","signal"} ' +
      '(or {"type":"error","error"}) and closes 1000; closing the socket kills the command',
    tag: "commands",
    query: S.TerminalQuery,
    responses: {},
  },
];

/** Path parameters, described once for every route that has them. */
export const PATH_PARAMS: Record<string, { schema: z.ZodType; description: string }> = {
  id: { schema: S.SandboxId, description: "Sandbox id" },
  tag: {
    schema: S.Tag,
    description: "Snapshot tag, in the caller's namespace (an admin: TENANT/TAG for a tenant's; URL-encoded)",
  },
  pid: { schema: z.number().int().min(1), description: "Guest pid of a command started through the API" },
  token_id: { schema: S.TokenId, description: "An API token's id (not its secret)" },
  webhook_id: { schema: S.WebhookId, description: "A webhook's id" },
  port: { schema: z.number().int().min(1).max(65535), description: "A guest TCP port" },
  context: {
    schema: S.ContextParam.shape.context,
    description: "A code context of a kernel (default or 16 hex digits)",
  },
};
