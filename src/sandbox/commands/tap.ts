/**
 * The fan-out of one tracked command's output to the readers attached to it (REST's
 * GET .../commands/:pid/stream, E2B envd's Start and Connect streams): each reader gets the
 * output from its attach on and the end. A reader either never holds the command back (one that
 * falls more than MAX_BEHIND bytes behind is cut) or paces it (`paces`: while it wants no more,
 * the command's output waits in the guest; one that takes nothing for STALL_MS is cut). At most
 * MAX_READERS at once; one that hangs up detaches only itself; one attached after the end gets
 * the end at once.
 */
import type { ExecHandlers, ExecResult } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";

/** A reader that does not pace falls at most this many bytes behind before it is cut. */
export const MAX_BEHIND = 4 << 20;
/** A pacing reader that takes nothing this long while output waits is cut. */
export const STALL_MS = 60_000;
/** Readers attached to one command at once. */
export const MAX_READERS = 64;

export interface CommandReader {
  /** One piece of output; false while the reader wants no more now. */
  output(stream: "stdout" | "stderr", data: Buffer): boolean;
  /** Resolves once the reader wants more (or is gone). */
  drained(): Promise<void>;
  /** The command exited (the last call). */
  exit(result: ExecResult): void;
  /** The command ended without an exit (the sandbox went away under it; the last call). */
  error(e: unknown): void;
  /** The reader fell too far behind (or stalled): its reply is cut (the last call). */
  cut(): void;
  /** While it wants no more, the command's output waits (default: never held back). */
  paces?: boolean;
}

type Outcome = { result: ExecResult } | { error: unknown };

interface Attached {
  reader: CommandReader;
  /** Bytes sent since the reader last said it wanted no more; null while it wants more. */
  behind: number | null;
}

export class CommandTap {
  private readers = new Set<Attached>();
  private outcome: Outcome | null = null;

  /**
   * The exec handlers that feed the attached readers and then `inner` (the owner, which paces
   * the command as it likes); the command's output also waits for its pacing readers.
   */
  handlers(inner: ExecHandlers): ExecHandlers {
    const both = (a: Promise<void> | undefined, b: unknown): unknown =>
      a === undefined ? b : Promise.all([a, b]);
    return {
      onStdout: (d) => both(this.feed("stdout", d), inner.onStdout?.(d)),
      onStderr: (d) => both(this.feed("stderr", d), inner.onStderr?.(d)),
    };
  }

  /** Attaches `reader` until the command ends; the returned function detaches it. */
  attach(reader: CommandReader): () => void {
    if (this.outcome) {
      deliver(reader, this.outcome);
      return () => undefined;
    }
    this.admit();
    const a: Attached = { reader, behind: null };
    this.readers.add(a);
    return () => void this.readers.delete(a);
  }

  /** Refuses a reader past MAX_READERS (attach() asks too; a door may ask before its reply starts). */
  admit(): void {
    if (!this.outcome && this.readers.size >= MAX_READERS)
      throw new ForkdError("resource_exhausted", `the command has ${MAX_READERS} readers attached`, {
        limit: MAX_READERS,
      });
  }

  get size(): number {
    return this.readers.size;
  }

  /** Output to every reader; resolves once the pacing readers want more (or were cut). */
  private feed(stream: "stdout" | "stderr", d: Buffer): Promise<void> | undefined {
    const waits: Promise<void>[] = [];
    for (const a of [...this.readers]) {
      if (a.reader.paces) {
        if (!a.reader.output(stream, Buffer.from(d))) waits.push(this.roomOrCut(a));
        continue;
      }
      if (a.behind !== null && a.behind + d.length > MAX_BEHIND) {
        this.cut(a);
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
    return waits.length === 0 ? undefined : Promise.all(waits).then(() => undefined);
  }

  /** A pacing reader's room, or its cut after STALL_MS. */
  private async roomOrCut(a: Attached): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const stalled = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(true), STALL_MS);
    });
    const drained = a.reader.drained().then(
      () => false,
      () => false,
    );
    const cut = await Promise.race([drained, stalled]);
    clearTimeout(timer);
    if (cut && this.readers.has(a)) this.cut(a);
  }

  private cut(a: Attached): void {
    this.readers.delete(a);
    a.reader.cut();
  }

  /** The command ended: every attached reader gets its exit (or error), then none is left. */
  end(outcome: Outcome): void {
    if (this.outcome) return;
    this.outcome = outcome;
    const rs = [...this.readers];
    this.readers.clear();
    for (const a of rs) deliver(a.reader, outcome);
  }
}

function deliver(reader: CommandReader, outcome: Outcome): void {
  if ("result" in outcome) reader.exit(outcome.result);
  else reader.error(outcome.error);
}
