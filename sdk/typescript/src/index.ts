/**
 * forkd's TypeScript SDK: sandboxes forked from warm microVM snapshots, shaped like E2B's SDK so
 * moving over is a change of import. Talks to the forkd daemon's REST API only.
 */
export { Sandbox, ForkError, DEFAULT_SNAPSHOT } from "./sandbox.js";
export type {
  SandboxOpts,
  SandboxInfo,
  RunCodeOpts,
  Language,
  BranchOpts,
  BranchInfo,
  NetworkOpts,
  NetworkInfo,
  SandboxMetrics,
  SnapshotInfo as SandboxSnapshotInfo,
} from "./sandbox.js";
export { SandboxPaginator } from "./paginator.js";
export { Pty } from "./pty.js";
export type { PtyCreateOpts } from "./pty.js";
export type { SandboxQuery } from "./paginator.js";
export { WatchHandle, FilesystemEventType } from "./watch.js";
export type { FilesystemEvent } from "./watch.js";
export { Controller, fork } from "./controller.js";
export { ApiClient } from "./api-client.js";
export { verifyWebhook } from "./webhook-signature.js";
export type { VerifyWebhookOpts } from "./webhook-signature.js";
export type {
  BuildSnapshotOptions,
  CallOpts,
  Requests,
  StreamOpts,
  SnapshotProgress,
  TransferProgress,
  Wire,
} from "./api-client.js";
export type { CreateSnapshotOpts, SnapshotInfo } from "./controller.js";
export { Commands, CommandHandle } from "./commands.js";
export type { CommandStartOpts, CommandOutput, ProcessInfo } from "./commands.js";
export { Files, FileType } from "./files.js";
export type { EntryInfo, FileOpts, WriteInfo, WriteEntry, FileData } from "./files.js";
export { Context, Execution, Result } from "./code.js";
export type { ExecutionError, Logs } from "./code.js";
export {
  ForkdError,
  SandboxError,
  InvalidArgumentError,
  NotFoundError,
  ConflictError,
  TimeoutError,
  AuthenticationError,
  RateLimitError,
  UnavailableError,
  GuestError,
  ConnectionError,
  CommandExitError,
  CommandTimeoutError,
} from "./errors.js";
export type { CommandResult } from "./errors.js";
export type { ConnectionOpts } from "./transport.js";
export { DEFAULT_SOCKET } from "./transport.js";
