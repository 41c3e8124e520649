/**
 * Commands started through the API that are still running, per sandbox, by guest pid: what
 * lets a client that started a command in the background signal it or feed its stdin later;
 * and the last HISTORY_MAX that ended, with how (the sandbox's command history, in memory: a
 * daemon restart starts it again). A pause suspends them (they run on in the saved guest and
 * stay listed) and the resume takes them over again (command-handle.ts); the commands a new
 * connection finds in the guest that no one tracked (after a daemon restart, in a child of a
 * branch) are tracked from then on (adopt()).
 */
import type { ExecHandle, ExecHandlers, InheritedExec } from "../agent/client.js";
import { ForkdError } from "../util/errors.js";
import { CommandHandle } from "./command-handle.js";
import { CommandTap } from "./command-tap.js";
import type { CommandReader } from "./command-tap.js";

export interface RunningCommand {
  pid: number;
  cmd: string[] | string;
  started: string;
  stdinOpen: boolean;
  /** Runs on a pseudo-terminal (its size can change). */
  pty: boolean;
  handle: CommandHandle;
  /** The readers attached to its output after its start. */
  tap: CommandTap;
}

/** At most this many tracked commands per sandbox; more still run, untracked ones cannot be signalled. */
export const MAX_TRACKED = 4096;

/** A command that ended, as the history keeps it. */
export interface EndedCommand {
  pid: number;
  cmd: string[] | string;
  started: string;
  ended: string;
  /** null: killed by `signal`, or the agent lost it (the sandbox ended under it). */
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  pty: boolean;
}

/** The commands that ended kept per sandbox, oldest dropped first. */
export const HISTORY_MAX = 256;

export class CommandTable {
  private readonly byPid = new Map<number, RunningCommand>();
  private readonly ended: EndedCommand[] = [];

  /**
   * Tracks `inner` from its start until it exits; `tap` (whose handlers() fed the exec, as
   * `handlers`) carries its output to the readers attached later (attach()). Returns the handle
   * its owner keeps: the same across a pause and resume (command-handle.ts).
   */
  track(
    cmd: string[] | string,
    stdinOpen: boolean,
    inner: ExecHandle,
    pty = false,
    tap: CommandTap = new CommandTap(),
    handlers: ExecHandlers = tap.handlers({}),
    started: Date | null = null,
  ): ExecHandle {
    const handle = new CommandHandle(inner, handlers);
    handle.result.then(
      (result) => tap.end({ result }),
      (error: unknown) => tap.end({ error }),
    );
    handle.started.then(
      ({ pid }) => {
        if (this.byPid.size >= MAX_TRACKED) return;
        const c: RunningCommand = {
          pid,
          cmd,
          started: (started ?? new Date()).toISOString(),
          stdinOpen,
          pty,
          handle,
          tap,
        };
        this.byPid.set(pid, c);
        const forget = (r: { exitCode: number | null; signal: number | null; timedOut: boolean }) => {
          if (this.byPid.get(pid) === c) this.byPid.delete(pid);
          this.remember({ pid, cmd, started: c.started, ended: new Date().toISOString(), pty, ...r });
        };
        handle.result.then(forget, () => forget({ exitCode: null, signal: null, timedOut: false }));
      },
      () => undefined,
    );
    return handle;
  }

  /**
   * The sandbox is pausing: its agent connection is about to end while its commands run on in
   * the saved guest. They stay listed; their owners and readers stay attached.
   */
  suspend(): void {
    for (const c of this.byPid.values()) c.handle.suspend();
  }

  /**
   * A new agent connection found `inherited` running in the guest (handover): the suspended
   * commands among them are bound to it again; one suspended that the guest no longer has
   * ended unseen; the others (a daemon restart, a child of a branch) are tracked from now on.
   */
  adopt(inherited: readonly InheritedExec[]): void {
    const byPid = new Map(inherited.map((i) => [i.pid, i]));
    for (const c of [...this.byPid.values()]) {
      if (!c.handle.suspended) continue;
      const i = byPid.get(c.pid);
      byPid.delete(c.pid);
      if (i) c.handle.rebind(i);
      else
        c.handle.lost(
          new ForkdError(
            "unavailable",
            `command ${c.pid} ended while its sandbox was paused; how is unknown`,
            {
              pid: c.pid,
            },
          ),
        );
    }
    for (const i of byPid.values()) {
      if (this.byPid.has(i.pid)) continue;
      const tap = new CommandTap();
      const handlers = tap.handlers({});
      i.attach(handlers);
      this.track(i.cmd, i.stdinOpen, i.handle, i.pty, tap, handlers, i.startedAt);
    }
  }

  /** The sandbox ended: every command it still tracks ends with `error` (a suspended one too). */
  lose(error: unknown): void {
    for (const c of this.byPid.values()) c.handle.lost(error);
  }

  /** Attaches `reader` to a running command's output from now on and its exit; returns the detach. */
  attach(pid: number, reader: CommandReader): () => void {
    return this.get(pid).tap.attach(reader);
  }

  get(pid: number): RunningCommand {
    const c = this.byPid.get(pid);
    if (!c) throw new ForkdError("not_found", `no running command with pid ${pid}`, { pid });
    return c;
  }

  writeStdin(pid: number, data: Uint8Array, eof: boolean): RunningCommand {
    const c = this.get(pid);
    if (!c.stdinOpen) {
      throw new ForkdError("conflict", `standard input of pid ${pid} is closed`, { pid });
    }
    if (data.length > 0) c.handle.writeStdin(data);
    if (eof) {
      c.handle.closeStdin();
      c.stdinOpen = false;
    }
    return c;
  }

  /** A PTY command's new terminal size. */
  resize(pid: number, rows: number, cols: number): RunningCommand {
    const c = this.get(pid);
    if (!c.pty) throw new ForkdError("conflict", `pid ${pid} does not run on a pseudo-terminal`, { pid });
    c.handle.resize(rows, cols);
    return c;
  }

  list(): readonly Readonly<RunningCommand>[] {
    return [...this.byPid.values()];
  }

  /** The commands that ended, oldest first (at most HISTORY_MAX). */
  history(): readonly Readonly<EndedCommand>[] {
    return [...this.ended];
  }

  private remember(e: EndedCommand): void {
    this.ended.push(e);
    if (this.ended.length > HISTORY_MAX) this.ended.splice(0, this.ended.length - HISTORY_MAX);
  }
}
