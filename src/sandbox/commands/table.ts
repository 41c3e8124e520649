/**
 * A sandbox's command registry: every command it runs, whichever door started it (REST's exec
 * and exec/stream, the terminal, E2B envd's Start, or found running in the guest), by guest pid
 * and tag, from its start until it exits; and the last HISTORY_MAX that ended, with how (in
 * memory: a daemon restart starts it again). One list, one history, and one way to signal a
 * command, write its stdin, resize its PTY and attach readers to its output (tap.ts). A start
 * past MAX_COMMANDS running is refused. A pause suspends them (they run on in the saved guest and
 * stay listed) and the resume takes them over again (handle.ts); the commands a new connection
 * finds in the guest that no one tracked (after a daemon restart, in a child of a branch) are
 * tracked from then on (adopt()).
 */
import type { ExecHandle, ExecHandlers, InheritedExec } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";
import type { CommandSpec, EndedCommand, RunningCommand } from "./command.js";
import { CommandHandle } from "./handle.js";
import { CommandTap } from "./tap.js";
import type { CommandReader } from "./tap.js";

// What outsiders use of the registry comes from here (and start.ts).
export type { CommandDoor, CommandSpec, EndedCommand, RunningCommand } from "./command.js";
export { argvOf } from "./command.js";
export type { CommandHandle } from "./handle.js";
export type { CommandReader, CommandTap } from "./tap.js";

/**
 * Commands running (or starting) per sandbox, at most: a start past it is refused (the guest
 * agent holds at most 1024 streams anyway; E2B envd's own bound was 1024 processes).
 */
export const MAX_COMMANDS = 1024;

/** The commands that ended kept per sandbox, oldest dropped first. */
export const HISTORY_MAX = 256;

/** How a command is tracked: its stdin, PTY, the tap its exec's `handlers` feed, its start time. */
export interface TrackOptions {
  stdinOpen: boolean;
  pty?: boolean;
  tap?: CommandTap;
  /** What its exec was given (default the tap's own handlers: no owner). */
  handlers?: ExecHandlers;
  startedAt?: Date | null;
}

export class CommandTable {
  private readonly byPid = new Map<number, RunningCommand>();
  private readonly ended: EndedCommand[] = [];
  /** Tracked, not yet started (counted against MAX_COMMANDS). */
  private starting = 0;

  /** Refuses a start while MAX_COMMANDS run (or are starting). */
  admit(): void {
    if (this.byPid.size + this.starting >= MAX_COMMANDS)
      throw new ForkdError(
        "resource_exhausted",
        `the sandbox runs ${MAX_COMMANDS} commands: wait for one to end, or signal one`,
        { limit: MAX_COMMANDS },
      );
  }

  /**
   * Tracks `inner` from its start until it exits; its tap carries its output to the readers
   * attached (attach()). Returns the handle its owner keeps: the same across a pause and resume
   * (handle.ts). Never refused (the command runs): a starter asks admit() before its exec.
   */
  track(spec: CommandSpec, inner: ExecHandle, o: TrackOptions): CommandHandle {
    const tap = o.tap ?? new CommandTap();
    const handle = new CommandHandle(inner, o.handlers ?? tap.handlers({}));
    const pty = o.pty ?? false;
    handle.result.then(
      (result) => tap.end({ result }),
      (error: unknown) => tap.end({ error }),
    );
    this.starting++;
    handle.started.then(
      ({ pid }) => {
        this.starting--;
        const c: RunningCommand = {
          ...spec,
          pid,
          started: (o.startedAt ?? new Date()).toISOString(),
          stdinOpen: o.stdinOpen,
          pty,
          handle,
          tap,
        };
        this.byPid.set(pid, c);
        const forget = (r: { exitCode: number | null; signal: number | null; timedOut: boolean }) => {
          if (this.byPid.get(pid) === c) this.byPid.delete(pid);
          const { cmd, tag, door, started } = c;
          this.remember({
            pid,
            cmd,
            ...(tag !== undefined ? { tag } : {}),
            door,
            started,
            ended: new Date().toISOString(),
            pty,
            ...r,
          });
        };
        handle.result.then(forget, () => forget({ exitCode: null, signal: null, timedOut: false }));
      },
      () => {
        this.starting--;
      },
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
   * ended unseen; the others (a daemon restart, a child of a branch) are tracked from now on
   * (never refused: they run).
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
      this.track({ cmd: i.cmd, door: "inherited" }, i.handle, {
        stdinOpen: i.stdinOpen,
        pty: i.pty,
        tap,
        handlers,
        startedAt: i.startedAt,
      });
    }
  }

  /** The sandbox ended: every command it still tracks ends with `error` (a suspended one too). */
  lose(error: unknown): void {
    for (const c of this.byPid.values()) c.handle.lost(error);
  }

  /** Attaches `reader` to a running command's output from now on and its end; returns the detach. */
  attach(pid: number, reader: CommandReader): () => void {
    return this.get(pid).tap.attach(reader);
  }

  get(pid: number): RunningCommand {
    const c = this.byPid.get(pid);
    if (!c) throw new ForkdError("not_found", `no running command with pid ${pid}`, { pid });
    return c;
  }

  /** The running command a selector names: its pid, or its tag (the first started with it). */
  find(sel: { pid: number } | { tag: string }): RunningCommand {
    if ("pid" in sel) return this.get(sel.pid);
    for (const c of this.byPid.values()) if (c.tag === sel.tag) return c;
    throw new ForkdError("not_found", `no running command tagged ${JSON.stringify(sel.tag)}`, {
      tag: sel.tag,
    });
  }

  signal(pid: number, sig: number): RunningCommand {
    const c = this.get(pid);
    c.handle.signal(sig);
    return c;
  }

  writeStdin(pid: number, data: Uint8Array, eof: boolean): RunningCommand {
    return this.input(this.get(pid), data, eof);
  }

  /** `data` to the standard input of `c` (one of list()'s), then its end if `eof`. */
  input(c: RunningCommand, data: Uint8Array, eof: boolean): RunningCommand {
    const pid = c.pid;
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

  list(): readonly RunningCommand[] {
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
