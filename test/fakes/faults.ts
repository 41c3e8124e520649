/**
 * Fault injection for the fake VMM: an operation fails, or something happens (the VMM dies, a
 * test looks) as it is called. Each fault fires `times` times (default once), on the next calls
 * of its operation (on one VM only, with `pid`).
 */
import { ForkdError } from "../../src/util/errors.js";

export type FakeOp =
  | "launch"
  | "adopt"
  | "connectAgent"
  | "restore"
  | "pause"
  | "resume"
  | "saveState"
  | "saveDevicesState"
  | "freezeDisk"
  | "setLink"
  | "stop"
  | "capture"
  | "apply"
  | "migrateRam"
  | "migrationFinish";

export interface Fault {
  /** The call fails with `vmm_error` and this message (or this error). */
  fail?: string | Error;
  /** Runs as the call is made (before it fails or goes on): e.g. `(p) => p.crash()`. */
  run?: (pid: number | null) => void | Promise<void>;
  /** A VM that never answers on its agent channel (launch and restore only). */
  silentGuest?: boolean;
  times?: number;
  pid?: number;
}

export class Faults {
  private readonly armed: Array<{ op: FakeOp; f: Fault; left: number }> = [];
  /** Calls of each operation so far (what the test may wait for). */
  readonly calls = new Map<FakeOp, number>();

  inject(op: FakeOp, f: Fault): void {
    this.armed.push({ op, f, left: f.times ?? 1 });
  }

  clear(): void {
    this.armed.length = 0;
  }

  /** The fault due for this call, consumed. */
  take(op: FakeOp, pid: number | null): Fault | null {
    this.calls.set(op, (this.calls.get(op) ?? 0) + 1);
    const a = this.armed.find((x) => x.op === op && x.left > 0 && (x.f.pid === undefined || x.f.pid === pid));
    if (!a) return null;
    a.left--;
    return a.f;
  }

  /** Applies the due fault of `op`: runs its hook, throws its failure. Returns it (or null). */
  async hit(op: FakeOp, pid: number | null): Promise<Fault | null> {
    const f = this.take(op, pid);
    if (!f) return null;
    if (f.run) await f.run(pid);
    if (f.fail !== undefined)
      throw f.fail instanceof Error ? f.fail : new ForkdError("vmm_error", `${op}: ${f.fail}`);
    return f;
  }
}
