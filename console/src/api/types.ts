/** The API's views the console reads, taken from the generated OpenAPI types (docs/openapi.json): no field is invented here. */
import type { components } from "../../../sdk/typescript/src/api.gen.js";

type S = components["schemas"];
export type Sandbox = S["Sandbox"];
export type Snapshot = S["Snapshot"];
export type SnapshotStatus = S["SnapshotStatus"];
export type SnapshotView = Snapshot | SnapshotStatus;
export type SnapshotInfo = S["SnapshotInfo"];
export type Health = S["Health"];
export type ForkResult = S["ForkResult"];
export type BranchResult = S["BranchResult"];
export type Command = S["Command"];
export type CommandList = S["CommandList"];
export type DirList = S["DirList"];
export type DirEntry = DirList["entries"][number];
export type FileWritten = S["FileWritten"];
export type Deleted = S["Deleted"];

/** Host usage of one running sandbox, as the `usage` event carries it. */
export interface Usage {
  cpu_percent: number;
  memory_bytes: number;
}

/** What a delete would do (DELETE /v1/snapshots/{tag}?dry_run=1), the contract's DeletePlan. */
export interface DeletePlan {
  tag: string;
  dry_run: true;
  deletes: string[];
  orphaned: string[];
  dependents: string[];
  sandboxes: string[];
  refused: boolean;
}

/** One audit log line (GET /v1/audit), the contract's AuditLine. */
export interface AuditLine {
  ts: string;
  request_id: string;
  caller: string;
  token: string | null;
  remote: string | null;
  action: string;
  target: Record<string, string | string[]>;
  status: number;
  result: string;
  duration_ms: number;
}
