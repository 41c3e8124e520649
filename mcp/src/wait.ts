/** wait_for_text: poll a file, or re-run a command, until its content shows the text. */
import { CommandExitError, NotFoundError, TimeoutError } from "@forkd/sdk";
import type { Sandbox } from "@forkd/sdk";

export interface WaitArgs {
  text: string;
  path?: string;
  command?: string;
  timeout_ms: number;
  interval_ms: number;
}

export async function waitForText(
  sb: Sandbox,
  a: WaitArgs,
): Promise<{ found: true; elapsed_ms: number; checks: number }> {
  if ((a.path === undefined) === (a.command === undefined)) {
    throw new Error("give exactly one of path or command");
  }
  const t0 = Date.now();
  let checks = 0;
  for (;;) {
    checks++;
    let seen = "";
    if (a.path !== undefined) {
      try {
        seen = await sb.files.read(a.path);
      } catch (e) {
        if (!(e instanceof NotFoundError)) throw e; // not there yet
      }
    } else {
      const left = Math.max(1, a.timeout_ms - (Date.now() - t0));
      try {
        const r = await sb.commands.run(a.command ?? "", { timeoutMs: Math.min(left, 60_000) });
        seen = r.stdout + r.stderr;
      } catch (e) {
        if (!(e instanceof CommandExitError)) throw e;
        seen = e.stdout + e.stderr; // a failing probe is normal while waiting
      }
    }
    if (seen.includes(a.text)) return { found: true, elapsed_ms: Date.now() - t0, checks };
    if (Date.now() - t0 + a.interval_ms > a.timeout_ms) {
      throw new TimeoutError(
        `"${a.text}" did not appear in ${a.path ?? `the output of ${a.command}`} within ${a.timeout_ms} ms (${checks} checks)`,
        { code: "timeout" },
      );
    }
    await new Promise((r) => setTimeout(r, a.interval_ms));
  }
}
