/**
 * The processes started through envd, per sandbox, from their start until they end: what
 * Connect, List, SendInput, SendSignal, CloseStdin and Update find by pid or tag. Each process
 * fans its events out to the streams attached to it (Start's and every Connect's); output with
 * no stream attached is dropped, as E2B's envd drops it, and a stream that lags holds the
 * process's output (paced in the guest) for at most STALL_MS before it is cut.
 */
import type { ExecHandle, ExecResult } from "../../agent/client.js";
import { ForkdError } from "../../util/errors.js";
import { EventQueue } from "./event-queue.js";

export interface ProcessConfigView {
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
}

/** What a stream of a process carries (the wire's ProcessEvent, before encoding). */
export type ProcEvent =
  | { type: "start"; pid: number }
  | { type: "data"; stream: "stdout" | "stderr" | "pty"; data: Uint8Array }
  | { type: "end"; exitCode: number; exited: boolean; status: string; error?: string };

/** A stream that holds the process's output this long (its reader took nothing) is cut. */
const STALL_MS = 60_000;
/** Processes tracked per sandbox; past it a Start is refused (they would be unreachable). */
export const MAX_PROCESSES = 1024;
/** Streams attached to one process at once. */
const MAX_STREAMS = 64;

export class EnvdProcess {
  pid = -1;
  private readonly streams = new Set<EventQueue<ProcEvent>>();
  private end: ProcEvent | null = null;
  private failed = false;
  stdinOpen: boolean;

  constructor(
    readonly config: ProcessConfigView,
    readonly tag: string | undefined,
    readonly pty: boolean,
    stdin: boolean,
    private handle: ExecHandle | null = null,
  ) {
    this.stdinOpen = stdin || pty;
  }

  get exec(): ExecHandle {
    if (!this.handle) throw new ForkdError("internal", "process not started");
    return this.handle;
  }

  set exec(h: ExecHandle) {
    this.handle = h;
  }

  get ended(): boolean {
    return this.end !== null || this.failed;
  }

  /** A new stream of this process's events from now on (null: it has ended). */
  attach(): EventQueue<ProcEvent> {
    if (this.streams.size >= MAX_STREAMS)
      throw new ForkdError("resource_exhausted", `process ${this.pid} has ${MAX_STREAMS} streams attached`);
    const q = new EventQueue<ProcEvent>();
    if (this.end) {
      q.push(this.end);
      q.close();
    } else if (this.failed) q.close(new ForkdError("not_found", `process ${this.pid} is gone`));
    else this.streams.add(q);
    return q;
  }

  detach(q: EventQueue<ProcEvent>): void {
    this.streams.delete(q);
    q.abandon();
  }

  /** Output to every attached stream; resolves when all have room again (paces the guest). */
  output(stream: "stdout" | "stderr" | "pty", data: Buffer): Promise<void> | undefined {
    const full: EventQueue<ProcEvent>[] = [];
    for (const q of this.streams)
      if (!q.push({ type: "data", stream, data: new Uint8Array(data) }, data.length)) full.push(q);
    if (full.length === 0) return undefined;
    return Promise.all(full.map((q) => this.roomOrCut(q))).then(() => undefined);
  }

  private async roomOrCut(q: EventQueue<ProcEvent>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const stalled = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(true), STALL_MS);
    });
    const cut = await Promise.race([q.room().then(() => false), stalled]);
    clearTimeout(timer);
    if (cut) {
      this.streams.delete(q);
      q.close(new ForkdError("resource_exhausted", `the stream's reader took nothing for ${STALL_MS} ms`));
    }
  }

  /** The process's end is unknown (its sandbox ended, the guest failed): its streams fail with why. */
  fail(error: unknown): void {
    this.failed = true;
    for (const q of this.streams) q.close(error);
    this.streams.clear();
  }

  /** The process ended: every stream gets the end event and closes. */
  finish(ev: ProcEvent): void {
    this.end = ev;
    for (const q of this.streams) {
      q.push(ev);
      q.close();
    }
    this.streams.clear();
  }
}

/** E2B's end event from forkd's exit: Go's ProcessState words ("exit status 1", "signal: killed"). */
export function endEvent(r: ExecResult): ProcEvent {
  if (r.signal !== null) {
    const name = SIGNAL_WORDS[r.signal] ?? `signal ${r.signal}`;
    return { type: "end", exitCode: -1, exited: false, status: `signal: ${name}`, error: `signal: ${name}` };
  }
  const code = r.exitCode ?? -1;
  const status = `exit status ${code}`;
  return { type: "end", exitCode: code, exited: true, status, ...(code !== 0 ? { error: status } : {}) };
}

const SIGNAL_WORDS: Record<number, string> = {
  1: "hangup",
  2: "interrupt",
  3: "quit",
  6: "aborted",
  9: "killed",
  11: "segmentation fault",
  13: "broken pipe",
  14: "alarm clock",
  15: "terminated",
};

/** The envd processes of every sandbox, by pid and tag. */
export class ProcessTable {
  private readonly bySandbox = new Map<string, Map<number, EnvdProcess>>();

  add(sandboxId: string, p: EnvdProcess): void {
    let m = this.bySandbox.get(sandboxId);
    if (!m) {
      m = new Map<number, EnvdProcess>();
      this.bySandbox.set(sandboxId, m);
    }
    m.set(p.pid, p);
  }

  remove(sandboxId: string, p: EnvdProcess): void {
    const m = this.bySandbox.get(sandboxId);
    if (m?.get(p.pid) !== p) return;
    m.delete(p.pid);
    if (m.size === 0) this.bySandbox.delete(sandboxId);
  }

  count(sandboxId: string): number {
    return this.bySandbox.get(sandboxId)?.size ?? 0;
  }

  list(sandboxId: string): EnvdProcess[] {
    return [...(this.bySandbox.get(sandboxId)?.values() ?? [])];
  }

  /** The running process a selector names (E2B's ProcessSelector: pid or tag). */
  find(sandboxId: string, sel: { pid?: number; tag?: string }): EnvdProcess {
    const m = this.bySandbox.get(sandboxId);
    let p: EnvdProcess | undefined;
    if (sel.pid !== undefined) p = m?.get(sel.pid);
    else if (sel.tag !== undefined) p = [...(m?.values() ?? [])].find((x) => x.tag === sel.tag);
    else throw new ForkdError("invalid_argument", "a process selector needs a pid or a tag");
    if (!p || p.ended) {
      const what = sel.pid !== undefined ? `pid ${sel.pid}` : `tag ${JSON.stringify(sel.tag)}`;
      throw new ForkdError("not_found", `process with ${what} not found`);
    }
    return p;
  }
}
