/**
 * What every sandbox operation is given (fork.ts, pause.ts, adopt.ts, ...): the daemon's
 * dependencies and the service's own state, built once by SandboxService (service.ts) and
 * passed in, never held in module state.
 */
import type { Cgroups } from "../host/index.js";
import type { NetworkService } from "../net/index.js";
import type { SnapshotStore } from "../snapshot/index.js";
import type { CrashPoint } from "../util/index.js";
import type { Logger } from "../util/index.js";
import type { Quarantine } from "../util/index.js";
import type { VmmDriver } from "../vmm/index.js";
import type { LiveCapturer, LiveMode } from "../vmm/index.js";
import type { MemoryDiffs } from "../vmm/index.js";
import type { Strays } from "../vmm/index.js";
import type { ToolRunner } from "../vmm/index.js";
import type { SandboxCluster } from "./cluster.js";
import type { WarmPool } from "./pool.js";
import type { SandboxRegistry } from "./registry.js";

export interface SandboxContext {
  /** <data>/sandboxes: one directory per sandbox, and fan-out journals. */
  readonly root: string;
  readonly store: SnapshotStore;
  readonly driver: VmmDriver;
  /** Host-side limits per sandbox (the driver's jail joins each VMM to its cgroup). */
  readonly cgroups: Cgroups | undefined;
  readonly log: Logger;
  /** TCG translation buffer per child (MiB). */
  readonly tbSizeMiB: number | undefined;
  /** Children started at once during a fan-out. */
  readonly forkParallelism: number;
  /** Sandboxes (running, exited-but-listed and starting) the daemon will hold at once. */
  readonly maxSandboxes: number;
  /** How long a child's agent may take to answer after its restore. */
  readonly readyTimeoutMs: number;
  /** How long a fork waits for a snapshot that is still being written. */
  readonly writingWaitMs: number;
  /** How private memory pages are captured and applied (branch, pause); null: neither is possible. */
  readonly memsnap: MemoryDiffs | null;
  /** A BRANCH's live memory capture (QEMU's precopy into forkd-memsnap); null: stopped copies only. */
  readonly liveCapture: LiveCapturer | null;
  /** When a BRANCH captures live (FORKD_BRANCH_LIVE). */
  readonly branchLive: LiveMode;
  readonly net: NetworkService;
  readonly strays: Strays;
  readonly quarantine: Quarantine;
  /** Test-only fault injection (src/util/crash.ts). */
  readonly crash: CrashPoint;
  readonly live: SandboxRegistry;
  readonly pool: WarmPool;
  /** Host tools on what VMMs wrote (qemu-img flattening a branch), jailed. */
  readonly tools: ToolRunner;
  /** The cluster this node is a member of (./cluster.ts); null: a daemon alone. */
  readonly cluster: SandboxCluster | null;
}
