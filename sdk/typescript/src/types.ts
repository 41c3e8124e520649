/** Shapes on the wire, from the generated OpenAPI types (src/api.gen.ts). */
import type { components } from "./api.gen.js";

type Schemas = components["schemas"];

export type SandboxWire = Schemas["Sandbox"];
export type SnapshotWire = Schemas["Snapshot"];
export type ForkResultWire = Schemas["ForkResult"];
export type ExecEventWire = Schemas["ExecEvent"];
export type EvalResultWire = Schemas["EvalResult"];
export type FileStatWire = Schemas["FileStat"];
export type DirListWire = Schemas["DirList"];
export type CommandWire = Schemas["Command"];
export type CreateSnapshotWire = Schemas["CreateSnapshot"];
export type SnapshotProgressWire = Schemas["SnapshotProgressEvent"];
export type HealthWire = Schemas["Health"];
export type VersionWire = Schemas["Version"];
export type BranchResultWire = Schemas["BranchResult"];
export type NetworkRequestWire = Schemas["NetworkRequest"];
/** The daemon's error codes (the wire's closed enum). */
export type ErrorCodeWire = Schemas["ErrorCode"];
