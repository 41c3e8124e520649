/** A running command as the API shows it (schema Command). */
import type { z } from "zod";
import type { RunningCommand } from "../../sandbox/commands.js";
import type * as schemas from "../contract/schemas.js";

export type CommandView = z.infer<typeof schemas.Command>;

export const commandView = (c: Readonly<RunningCommand>): CommandView => ({
  pid: c.pid,
  cmd: c.cmd,
  started: c.started,
  stdin_open: c.stdinOpen,
  pty: c.pty,
});
