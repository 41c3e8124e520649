/**
 * Starting a command in a leased sandbox, for every door (REST's exec, the terminal, E2B envd's
 * Start): admitted by the sandbox's registry (table.ts), run by the guest agent, tracked from its
 * start (listed, signalled, attached to, through a pause and resume), its first stdin written.
 * Its failure to start says why: a bad cwd, or (`explain`: the lease's) the sandbox ending under it.
 */
import type { AgentClient, ExecHandlers, ExecRequest } from "../../agent/index.js";
import { withStartExplained } from "../../agent/index.js";
import type { CommandSpec } from "./command.js";
import type { CommandHandle } from "./handle.js";
import type { CommandTable } from "./table.js";
import { CommandTap } from "./tap.js";

/** What a start needs of a sandbox's lease (src/sandbox/lease.ts). */
export interface StartIn {
  agent: AgentClient;
  commands: CommandTable;
  /** A failure of the command, in the caller's terms (the sandbox ended under it). */
  explain: (e: unknown) => Promise<unknown>;
}

export interface StartOptions {
  /** How the lists show it (what it runs defaults to the request's argv or shell line). */
  spec: Omit<CommandSpec, "cmd"> & { cmd?: CommandSpec["cmd"] };
  /** Its standard input stays open after `stdin` (for later writes). */
  keepStdinOpen: boolean;
  /** Written to its standard input first (then closed unless keepStdinOpen). */
  stdin?: Uint8Array;
  /**
   * Its owner's handlers (an exec's reply): they get all its output and pace it as they like.
   * Without an owner, output goes only to the readers attached to the tap (others drop it).
   */
  owner?: ExecHandlers;
}

export interface StartedCommand {
  handle: CommandHandle;
  /** Its output's fan-out: readers attached now miss nothing. */
  tap: CommandTap;
}

/** Starts `req` in the sandbox of `lease` (refused past the registry's bound). */
export function startCommand(lease: StartIn, req: ExecRequest, o: StartOptions): StartedCommand {
  lease.commands.admit();
  const tap = new CommandTap();
  const handlers = tap.handlers(o.owner ?? {});
  const inner = withStartExplained(lease.agent, req, lease.agent.exec(req, handlers), lease.explain);
  const cmd = o.spec.cmd ?? req.argv ?? req.shell ?? [];
  const handle = lease.commands.track({ ...o.spec, cmd }, inner, {
    stdinOpen: o.keepStdinOpen,
    pty: req.pty !== undefined,
    tap,
    handlers,
  });
  if (o.stdin !== undefined) handle.writeStdin(o.stdin);
  if (o.stdin !== undefined && !o.keepStdinOpen) handle.closeStdin();
  return { handle, tap };
}
