/**
 * A tracked command's handle that outlives its agent connection: a pause ends the connection
 * (the VMM quits) while the command runs on in the saved guest, and the connection made at the
 * resume takes it over (src/agent/handover.ts). The handle its owner holds (an exec/stream
 * reply, an envd process) stays the same: suspend() detaches it from the old connection (whose
 * end is then not the command's), rebind() attaches it to the new one with the same output
 * handlers, and what was asked of it meanwhile (stdin, signals, a size) is passed on then.
 * lost() ends it when it cannot come back (the sandbox ended, or the guest no longer has it).
 */
import { checkPtySize } from "../../agent/index.js";
import type { ExecHandle, ExecHandlers, ExecResult, InheritedExec } from "../../agent/index.js";

/** Stdin queued while suspended, at most (more is dropped: nobody reads it meanwhile). */
const QUEUED_STDIN_MAX = 1 << 20;

export class CommandHandle implements ExecHandle {
  readonly started: Promise<{ pid: number }>;
  readonly result: Promise<ExecResult>;
  private inner: ExecHandle | null;
  private settle!: { resolve: (r: ExecResult) => void; reject: (e: unknown) => void };
  private queued: ((h: ExecHandle) => void)[] = [];
  private queuedBytes = 0;
  private over = false;

  constructor(
    inner: ExecHandle,
    /** Where its output goes, on every connection it is bound to. */
    private readonly handlers: ExecHandlers,
  ) {
    this.inner = inner;
    this.started = inner.started;
    this.result = new Promise<ExecResult>((resolve, reject) => {
      this.settle = { resolve, reject };
    });
    this.result.catch(() => undefined); // its owner observes it
    this.follow(inner);
  }

  /** Whether it waits for a connection (its sandbox paused). */
  get suspended(): boolean {
    return this.inner === null && !this.over;
  }

  /** Its connection is going away while the command runs on (a pause): its end is not the command's. */
  suspend(): void {
    this.inner = null;
  }

  /** The new connection's handle of the same command: its output goes to this one's handlers. */
  rebind(i: InheritedExec): void {
    if (this.over) return;
    i.attach(this.handlers);
    this.inner = i.handle;
    this.follow(i.handle);
    for (const op of this.queued.splice(0)) {
      try {
        op(i.handle);
      } catch {
        /* a size the command no longer takes: nothing to tell anyone now */
      }
    }
    this.queuedBytes = 0;
  }

  /** It cannot come back: its result fails with `error`. */
  lost(error: unknown): void {
    if (this.over) return;
    this.over = true;
    this.inner = null;
    this.queued = [];
    this.settle.reject(error);
  }

  private follow(h: ExecHandle): void {
    h.result.then(
      (r) => {
        if (this.inner !== h || this.over) return;
        this.over = true;
        this.settle.resolve(r);
      },
      (e: unknown) => {
        if (this.inner !== h || this.over) return;
        this.over = true;
        this.settle.reject(e);
      },
    );
  }

  /** `op` on the current connection's handle, or once it is back. */
  private later(op: (h: ExecHandle) => void, bytes = 0): void {
    if (this.inner) return op(this.inner);
    if (this.over || this.queuedBytes + bytes > QUEUED_STDIN_MAX) return;
    this.queuedBytes += bytes;
    this.queued.push(op);
  }

  writeStdin(data: Uint8Array): void {
    const copy = this.inner ? data : Uint8Array.from(data);
    this.later((h) => h.writeStdin(copy), data.length);
  }

  closeStdin(): void {
    this.later((h) => h.closeStdin());
  }

  signal(sig: number): void {
    this.later((h) => h.signal(sig));
  }

  resize(rows: number, cols: number): void {
    checkPtySize(rows, cols);
    this.later((h) => h.resize(rows, cols));
  }
}
