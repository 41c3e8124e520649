/**
 * `forkd branch ID`: snapshot a running sandbox. The daemon pauses it for a moment, lets it run
 * again, and writes the snapshot in the background; the CLI asks for exactly that (wait: false),
 * says what the pause cost, then follows the snapshot until it is ready (unless --no-wait), so
 * each phase shows as it happens.
 */
import type { Command } from "commander";
import { ForkdError } from "@forkd/sdk";
import type { ApiClient, Wire } from "@forkd/sdk";
import type { CliContext } from "../context.js";
import { ProgressView, mib } from "../progress.js";
import { CALL_MS, HEAVY_MS } from "../timeouts.js";
import { sleep } from "../../util/index.js";

/** Waits until `tag` is ready (its metadata), or throws the failure the daemon recorded. */
export async function snapshotWritten(
  api: ApiClient,
  tag: string,
  deadlineMs: number,
  pollMs = 250,
): Promise<Wire["Snapshot"]> {
  const deadline = Date.now() + deadlineMs;
  for (;;) {
    const s = await api.getSnapshot(tag, { timeoutMs: CALL_MS });
    if (!("status" in s) || (s.status !== "writing" && s.status !== "failed")) return s as Wire["Snapshot"];
    if (s.status === "failed") {
      throw new ForkdError(s.error?.message ?? `snapshot ${tag} failed`, {
        code: s.error?.code ?? "internal",
      });
    }
    if (Date.now() > deadline) throw new Error(`snapshot ${tag} still not written after ${deadlineMs} ms`);
    await sleep(pollMs);
  }
}

export function branchCommand(program: Command, ctx: CliContext): void {
  program
    .command("branch")
    .description("snapshot a running sandbox (short pause) as a new tag to fork from")
    .argument("<id>")
    .option("--tag <tag>", "tag of the new snapshot (default: br-<random>)")
    .option("--no-wait", "return as soon as the sandbox runs again; the snapshot finishes in the background")
    .option("--json", "JSON output")
    .action(async (id: string, o: { tag?: string; wait: boolean; json?: boolean }) => {
      const api = await ctx.ready();
      const view = new ProgressView(ctx.progressOut);
      let r: Wire["BranchResult"];
      try {
        view.local({ phase: "pause", message: `pausing ${id} to copy its memory and disk` });
        r = await api.branch(id, { ...(o.tag ? { tag: o.tag } : {}), wait: false }, { timeoutMs: HEAVY_MS });
        if (o.wait && r.status === "writing") {
          view.local({
            phase: "write",
            message: `${id} runs again after ${r.pause_ms.toFixed(1)} ms; writing ${r.tag} (${mib(r.private_bytes)} private memory)`,
          });
          r = { ...r, status: "ready", snapshot: await snapshotWritten(api, r.tag, HEAVY_MS) };
        }
      } finally {
        view.end();
      }
      if (o.json) console.log(JSON.stringify(r, null, 2));
      else
        console.log(
          `${r.tag} ${r.status}: paused ${r.pause_ms.toFixed(1)} ms, ${(r.private_bytes / 2 ** 20).toFixed(1)} MiB private memory`,
        );
    });
}
