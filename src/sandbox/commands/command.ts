/**
 * What the command registry (table.ts) knows of a command, whichever door started it: what it
 * runs and how it was asked for (CommandSpec), then while it runs (RunningCommand) and once it
 * ended (EndedCommand, the history's entry).
 */
import type { CommandHandle } from "./handle.js";
import type { CommandTap } from "./tap.js";

/** Which door started a command; `inherited`: found running in the guest (a daemon restart, a branch). */
export type CommandDoor = "api" | "terminal" | "envd" | "inherited";

/** A command as its starter asked for it (what the lists show). */
export interface CommandSpec {
  /** argv, or a shell line (run as `/bin/sh -c LINE`). */
  cmd: string[] | string;
  /** The environment its starter gave (not the sandbox's nor the account's defaults). */
  env?: Record<string, string>;
  /** The directory its starter gave. */
  cwd?: string;
  /** A name its starter gave (E2B's process tag): found by it while it runs. */
  tag?: string;
  door: CommandDoor;
}

export interface RunningCommand extends CommandSpec {
  pid: number;
  started: string;
  stdinOpen: boolean;
  /** Runs on a pseudo-terminal (its size can change). */
  pty: boolean;
  handle: CommandHandle;
  /** The readers attached to its output. */
  tap: CommandTap;
}

/** A command that ended, as the history keeps it. */
export interface EndedCommand {
  pid: number;
  cmd: string[] | string;
  tag?: string;
  door: CommandDoor;
  started: string;
  ended: string;
  /** null: killed by `signal`, or the agent lost it (the sandbox ended under it). */
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  pty: boolean;
}

/** Its argv as E2B's envd shows a process: a shell line runs as `/bin/sh -c LINE`. */
export const argvOf = (cmd: string[] | string): string[] =>
  typeof cmd === "string" ? ["/bin/sh", "-c", cmd] : cmd;
