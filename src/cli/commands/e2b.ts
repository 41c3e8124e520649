/**
 * `forkd e2b env [--key KEY]`: the exports that point E2B's SDKs (and every tool built on them) at
 * this daemon's E2B API (FORKD_E2B_LISTEN): E2B_API_URL and E2B_SANDBOX_URL, E2B_API_KEY (the key
 * given, else a placeholder to replace with one from `forkd token create --tenant T --e2b`) and
 * E2B_DOMAIN when the daemon has one (FORKD_E2B_DOMAIN). `eval "$(forkd e2b env --key …)"`.
 */
import type { Command } from "commander";
import type { CliContext } from "../context.js";
import { CALL_MS } from "../timeouts.js";

/** A value as one shell word. */
const quote = (v: string): string =>
  /^[A-Za-z0-9_./:@%+=,-]+$/.test(v) ? v : `'${v.replace(/'/g, `'\\''`)}'`;

export function e2bCommands(program: Command, ctx: CliContext): void {
  const e2b = program.command("e2b").description("E2B's API on this daemon (FORKD_E2B_LISTEN)");
  e2b
    .command("env")
    .description("print the shell exports E2B's SDKs read (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, ...)")
    .option("--key <key>", "the E2B API key to export (from `forkd token create --tenant T --e2b`)")
    .action(async (o: { key?: string }) => {
      const v = await (await ctx.ready()).version({ timeoutMs: CALL_MS });
      if (!v.e2b) {
        ctx.say("forkd: the daemon serves no E2B API: start it with FORKD_E2B_LISTEN=HOST:PORT");
        process.exitCode = 1;
        return;
      }
      const vars: Array<[string, string]> = [
        ["E2B_API_URL", v.e2b.url],
        ["E2B_SANDBOX_URL", v.e2b.url],
        ["E2B_API_KEY", o.key ?? "e2b_REPLACE_WITH_forkd_token_create_--e2b"],
      ];
      if (v.e2b.domain) vars.push(["E2B_DOMAIN", v.e2b.domain]);
      if (!o.key)
        ctx.say("forkd: E2B_API_KEY is a placeholder: make a key with `forkd token create --tenant T --e2b`");
      for (const [k, val] of vars) console.log(`export ${k}=${quote(val)}`);
    });
}
