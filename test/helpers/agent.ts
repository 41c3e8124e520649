/**
 * The real guest agent binary run on the host (no VM), over a socketpair: the fixture of the
 * tests that hold the host's agent client to the protocol both sides are written to.
 */
import { execFileSync, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import type { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentClient } from "../../src/agent/client.js";
import { REPO_DIR } from "../../src/host/paths.js";

export interface HostAgent {
  agent: AgentClient;
  /** A scratch directory for the test's files (removed by close()). */
  dir: string;
  close(): Promise<void>;
}

/**
 * Starts the agent; with `python`, its warm interpreter too (waits until it is up); with `node`,
 * the JavaScript kernel run by this Node.
 */
export async function startHostAgent(
  o: { python?: boolean; node?: boolean; stdio?: "inherit" | "ignore" } = {},
): Promise<HostAgent> {
  const bin = join(REPO_DIR, "guest/agent/forkd-agent");
  if (!existsSync(bin)) execFileSync("make", ["-s", "-C", join(REPO_DIR, "guest/agent")]);
  const dir = await mkdtemp(join(tmpdir(), "forkd-agent-"));
  const python = o.python
    ? ["--python", "/usr/bin/python3", "--evalsrv", join(REPO_DIR, "guest/evalsrv/forkd_eval.py")]
    : ["--python", "/nonexistent"];
  if (o.node)
    python.push("--node", process.execPath, "--evaljs", join(REPO_DIR, "guest/evalsrv/forkd_eval.js"));
  const out = o.stdio ?? "ignore";
  const proc = spawn(bin, ["--fd", "3", "--no-init", ...python], { stdio: ["ignore", out, out, "pipe"] });
  const agent = AgentClient.fromSocket(proc.stdio[3] as Socket, "agent-under-test", undefined, {
    handover: true,
  });
  if (o.python || o.node) {
    let ready = false;
    for (let i = 0; i < 100 && !ready; i++) {
      ready = (await agent.ping()).evalReady;
      if (!ready) await new Promise((r) => setTimeout(r, 100));
    }
    if (!ready) {
      agent.close();
      proc.kill("SIGKILL");
      await rm(dir, { recursive: true, force: true });
      throw new Error("the host agent's warm interpreter did not come up within 10 s");
    }
  } else await agent.ping();
  return {
    agent,
    dir,
    async close() {
      agent.close();
      proc.kill("SIGKILL");
      await rm(dir, { recursive: true, force: true });
    },
  };
}
