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
export type CommandHistory = S["CommandHistory"];
export type DirList = S["DirList"];
export type DirEntry = DirList["entries"][number];
export type FileWritten = S["FileWritten"];
export type Deleted = S["Deleted"];

/** Host usage of one running sandbox, as the `usage` event carries it. */
export interface Usage {
  cpu_percent: number;
  memory_bytes: number;
}
export type DeletePlan = S["DeletePlan"];
export type AuditLine = S["AuditLine"];
export type AuditLines = S["AuditLines"];
export type ConsoleCaller = S["ConsoleCaller"];
export type ClusterNode = S["ClusterNode"];
export type NodeList = S["NodeList"];
