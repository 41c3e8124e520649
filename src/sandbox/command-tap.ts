/**
 * The fan-out of one tracked command's output to the readers attached to it after its start
 * (GET /v1/sandboxes/:id/commands/:pid/stream): each reader gets the output from its attach on
 * and the exit. A reader never paces the command (its owner does): one that falls more than
 * MAX_BEHIND bytes behind is cut; one that hangs up detaches only itself.
 */
import type { ExecHandlers, ExecResult } from "../agent/client.js";

/** An attached reader falls at most this many bytes behind before it is cut. */
export const MAX_BEHIND = 4 << 20;

export interface CommandReader {
  /** One piece of output; false while the reader wants no more now. */
  output(stream: "stdout" | "stderr", data: Buffer): boolean;
  /** Resolves once the reader wants more (or is gone). */
  drained(): Promise<void>;
  /** The command exited (the last call). */
  exit(result: ExecResult): void;
  /** The command ended without an exit (the sandbox went away under it; the last call). */
  error(e: unknown): void;
  /** The reader fell too far behind: its reply is cut (the last call). */
  cut(): void;
}

interface Attached {
  reader: CommandReader;
  /** Bytes sent since the reader last said it wanted no more; null while it wants more. */
  behind: number | null;
}

export class CommandTap {
  private readers = new Set<Attached>();
  private ended = false;

  /** The exec handlers that feed the attached readers and then `inner` (whose pacing is kept). */
  handlers(inner: ExecHandlers): ExecHandlers {
    return {
      onStdout: (d) => {
        this.feed("stdout", d);
        return inner.onStdout?.(d);
      },
      onStderr: (d) => {
        this.feed("stderr", d);
        return inner.onStderr?.(d);
      },
    };
  }

  /** Attaches `reader` until the command ends; the returned function detaches it. */
  attach(reader: CommandReader): () => void {
    const a: Attached = { reader, behind: null };
    if (!this.ended) this.readers.add(a);
    return () => void this.readers.delete(a);
  }

  get size(): number {
    return this.readers.size;
  }

  private feed(stream: "stdout" | "stderr", d: Buffer): void {
    for (const a of [...this.readers]) {
      if (a.behind !== null && a.behind + d.length > MAX_BEHIND) {
        this.readers.delete(a);
        a.reader.cut();
        continue;
      }
      if (a.behind !== null) a.behind += d.length;
      const more = a.reader.output(stream, Buffer.from(d));
      if (!more && a.behind === null) {
        a.behind = 0;
        a.reader.drained().then(
          () => {
            a.behind = null;
          },
          () => this.readers.delete(a),
        );
      }
    }
  }

  /** The command ended: every attached reader gets its exit (or error), then none is left. */
  end(outcome: { result: ExecResult } | { error: unknown }): void {
    this.ended = true;
    const rs = [...this.readers];
    this.readers.clear();
    for (const a of rs) {
      if ("result" in outcome) a.reader.exit(outcome.result);
      else a.reader.error(outcome.error);
    }
  }
}
