/** A running or an ended command as the API shows it (schemas Command, EndedCommand). */
import type { z } from "zod";
import type { EndedCommand, RunningCommand } from "../../sandbox/index.js";
import type * as schemas from "../contract/schemas.js";

export type CommandView = z.infer<typeof schemas.Command>;

export const commandView = (c: Readonly<RunningCommand>): CommandView => ({
  pid: c.pid,
  cmd: c.cmd,
  started: c.started,
  stdin_open: c.stdinOpen,
  pty: c.pty,
  source: c.door,
  ...(c.tag !== undefined ? { tag: c.tag } : {}),
});

export type EndedCommandView = z.infer<typeof schemas.EndedCommand>;

export const endedCommandView = (c: Readonly<EndedCommand>): EndedCommandView => ({
  pid: c.pid,
  cmd: c.cmd,
  started: c.started,
  ended: c.ended,
  exit_code: c.exitCode,
  signal: c.signal,
  timed_out: c.timedOut,
  pty: c.pty,
  source: c.door,
  ...(c.tag !== undefined ? { tag: c.tag } : {}),
});
