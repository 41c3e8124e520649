#!/usr/bin/env node
/**
 * forkd CLI: a client of the daemon's REST API like the others, through the TypeScript SDK
 * (@forkd/sdk's ApiClient) only; `forkd daemon` runs the daemon. Exit codes: 0 ok; 1 error;
 * 2 usage / invalid argument; 3 not found; 128 + N cut by signal N; exec exits with the guest
 * command's code.
 */
import { Command, CommanderError } from "commander";
import { VERSION } from "../host/index.js";
import { branchCommand } from "./commands/branch.js";
import { cacheCommands } from "./commands/cache.js";
import { clusterCommands } from "./commands/cluster.js";
import { consoleCommand } from "./commands/console.js";
import { daemonCommands } from "./commands/daemon.js";
import { execCommands } from "./commands/exec.js";
import { fileCommands } from "./commands/files.js";
import { sandboxCommands } from "./commands/sandboxes.js";
import { snapshotCommands } from "./commands/snapshots.js";
import { tokenCommands } from "./commands/tokens.js";
import { webhookCommands } from "./commands/webhooks.js";
import { e2bCommands } from "./commands/e2b.js";
import { transferCommands } from "./commands/transfer.js";
import { makeContext } from "./context.js";
import type { CliContext } from "./context.js";
import { reportFailure } from "./errors.js";
import { quickstart } from "./quickstart.js";

function buildProgram(ctx: CliContext): Command {
  const program = new Command("forkd")
    .description("Hardware-isolated sandboxes forked copy-on-write from warm microVM snapshots")
    .version(VERSION)
    // Commander's errors are thrown to main() (which exits 2 for a usage error) instead of
    // exiting 1 itself; the subcommands defined below inherit this.
    .exitOverride();

  daemonCommands(program, ctx);
  program
    .command("quickstart")
    .description("snapshot a warm Python parent (once), fork N children, run code in each, show timings")
    .option("-n <n>", "number of children", (v) => parseInt(v, 10), 10)
    .option("--tag <tag>", "snapshot tag to use or create", "quickstart")
    .option("--keep", "leave the children running")
    .action(async (o: { n: number; tag: string; keep?: boolean }) => {
      const api = await ctx.ready();
      process.exitCode = await quickstart(
        api,
        { n: o.n, tag: o.tag, keep: o.keep ?? false },
        ctx.say,
        ctx.progressOut,
      );
    });
  snapshotCommands(program, ctx);
  sandboxCommands(program, ctx);
  branchCommand(program, ctx);
  execCommands(program, ctx);
  fileCommands(program, ctx);
  transferCommands(program, ctx);
  tokenCommands(program, ctx);
  webhookCommands(program, ctx);
  e2bCommands(program, ctx);
  cacheCommands(program, ctx);
  consoleCommand(program, ctx);
  clusterCommands(program, ctx);
  return program;
}

async function main(argv: string[], env: NodeJS.ProcessEnv): Promise<void> {
  const say = (line: string) => void process.stderr.write(line + "\n");
  try {
    await buildProgram(makeContext(env, say)).parseAsync(argv);
  } catch (e) {
    if (e instanceof CommanderError) {
      // Help and --version exit 0; anything else is a usage error commander has already printed.
      process.exit(e.exitCode === 0 ? 0 : 2);
    }
    process.exit(reportFailure(e, say));
  }
}

void main(process.argv, process.env);
