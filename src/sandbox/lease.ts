/**
 * Using a running sandbox's agent for one API operation (exec, files, eval): the sandbox counts
 * as in use (never idle) meanwhile, and a call cut because the sandbox ended under it says why.
 */
import type { AgentClient } from "../agent/index.js";
import { ForkdError } from "../util/index.js";
import { sleep } from "../util/index.js";
import type { CommandTable } from "./commands/table.js";
import type { SandboxRegistry } from "./registry.js";

export interface Lease {
  agent: AgentClient;
  commands: CommandTable;
  release: () => void;
  explain: (e: unknown) => Promise<unknown>;
}

/**
 * The sandbox's agent for one API operation: the sandbox counts as in use (never idle) until
 * release() is called, and its idle timeout restarts then. `explain` turns a failure of the
 * operation into what the caller is told (see explain()).
 */
export function lease(live: SandboxRegistry, id: string): Lease {
  const s = live.running(id);
  s.busy++;
  s.lastUsed = Date.now();
  let released = false;
  return {
    agent: s.agent,
    commands: s.commands,
    explain: (e) => explain(live, id, e),
    release: () => {
      if (released) return;
      released = true;
      s.busy--;
      s.lastUsed = Date.now();
    },
  };
}

/** Runs `fn` with the sandbox's agent, leased for its duration. */
export async function use<T>(
  live: SandboxRegistry,
  id: string,
  fn: (agent: AgentClient, commands: CommandTable) => Promise<T>,
): Promise<T> {
  const l = lease(live, id);
  try {
    return await fn(l.agent, l.commands);
  } catch (e) {
    throw await explain(live, id, e);
  } finally {
    l.release();
  }
}

/**
 * A call cut because its sandbox ended under it fails with `unavailable` and why it ended,
 * never with a bare lost connection: the host retired it (a kill, its lifetime, a limit: the
 * reason is recorded before its agent connection is closed, so it is known at once), or its
 * VMM died by itself (a memory limit, a crash: known once the daemon has seen the exit).
 */
async function explain(live: SandboxRegistry, id: string, e: unknown): Promise<unknown> {
  const s = live.find(id);
  if (!s || !(e instanceof ForkdError) || e.code !== "unavailable") return e;
  if (typeof e.details.errno === "number") return e; // the guest said so: it is alive (eval.ts)
  const retired = () => s.state === "exited";
  if (!retired()) {
    const vm = s.vm;
    if (!vm) return e;
    await vm.waitExit(1_000).catch(() => undefined);
    if (!vm.exited) return e;
    // The jail's verdict follows the exit; it is not waited on past a few seconds.
    await Promise.race([vm.released, sleep(5_000)]).catch(() => undefined);
    // onExit retires it once the jail has said why (the cgroup's verdict).
    for (let i = 0; i < 400 && !retired(); i++) await sleep(25);
  }
  return new ForkdError(
    "unavailable",
    `sandbox ${id} exited: ${s.exitReason ?? "vmm process exited"}`,
    { id, exit_reason: s.exitReason },
    e,
  );
}
