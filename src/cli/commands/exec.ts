/** Commands and code in a sandbox: exec (streamed), eval, ps, signal, stdin. */
import { Option } from "commander";
import type { Command } from "commander";
import type { ApiClient, Requests } from "@forkd/sdk";
import type { CliContext } from "../context.js";
import { interruptible } from "../interrupt.js";
import { printTable } from "../table.js";
import { CALL_MS, TRANSFER_IDLE_MS, evalMs, execIdleMs } from "../timeouts.js";

/**
 * Runs one exec stream, writing the command's output as it comes (stdout and stderr to
 * `out`/`err`); its exit code (128 + N for a signal).
 */
export async function execStream(
  api: ApiClient,
  id: string,
  body: Requests["Exec"],
  o: { idleMs: number; signal?: AbortSignal; out: NodeJS.WritableStream; err: NodeJS.WritableStream },
  say: (s: string) => void,
): Promise<number> {
  let code: number | null = null;
  await api.execStream(
    id,
    body,
    (ev) => {
      if (ev.type === "stdout") o.out.write(Buffer.from(ev.data, "base64"));
      else if (ev.type === "stderr") o.err.write(Buffer.from(ev.data, "base64"));
      else if (ev.type === "exit") {
        if (ev.timed_out) say("forkd: command timed out");
        code = ev.exit_code ?? 128 + (ev.signal ?? 0);
      } else if (ev.type === "error") {
        say(`forkd: ${ev.error.message}`);
        code = 1;
      }
    },
    { timeoutMs: o.idleMs, ...(o.signal ? { signal: o.signal } : {}) },
  );
  if (code === null) {
    say("forkd: the daemon ended the command's stream before it exited");
    return 1;
  }
  return code;
}

export function execCommands(program: Command, ctx: CliContext): void {
  program
    .command("exec")
    .description("run a command in a sandbox, streaming its output; exits with its exit code")
    .argument("<id>")
    .argument("<cmd...>")
    .option("--timeout <ms>", "kill the command after this many ms", (v) => parseInt(v, 10))
    .option("--cwd <dir>", "working directory")
    .option("-e, --env <KEY=VALUE...>", "environment variables")
    .option("-i, --stdin", "send this command's standard input (read to its end, UTF-8) to the command")
    .action(
      async (
        id: string,
        cmd: string[],
        o: { timeout?: number; cwd?: string; env?: string[]; stdin?: boolean },
      ) => {
        const api = await ctx.ready();
        const env = Object.fromEntries(
          (o.env ?? []).map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]),
        );
        let stdin: string | undefined;
        if (o.stdin) {
          const chunks: Buffer[] = [];
          for await (const c of process.stdin) chunks.push(c as Buffer);
          stdin = Buffer.concat(chunks).toString("utf8");
        }
        const body: Requests["Exec"] = {
          cmd,
          ...(o.env ? { env } : {}),
          ...(o.cwd !== undefined ? { cwd: o.cwd } : {}),
          ...(o.timeout !== undefined ? { timeout_ms: o.timeout } : {}),
          ...(stdin !== undefined ? { stdin } : {}),
        };
        // Ctrl-C or a hang-up cuts the stream: the daemon then kills the command.
        process.exitCode = await interruptible("the command is killed", (signal) =>
          execStream(
            api,
            id,
            body,
            { idleMs: execIdleMs(o.timeout), signal, out: process.stdout, err: process.stderr },
            ctx.say,
          ),
        );
      },
    );

  program
    .command("eval")
    .description("run Python (or JavaScript) code in the sandbox's warm interpreter")
    .argument("<id>")
    .argument("<code>")
    .addOption(
      new Option("--language <lang>", "the kernel: python, or javascript (needs node in the image)")
        .choices(["python", "javascript"])
        .default("python"),
    )
    .option("--json", "JSON output")
    .action(async (id: string, code: string, o: { json?: boolean; language: string }) => {
      // sent only when not python, so python cells work against a daemon from before the field
      const body = { code, ...(o.language !== "python" ? { language: o.language } : {}) } as Requests["Eval"];
      const r = await (await ctx.ready()).eval(id, body, { timeoutMs: evalMs() });
      if (o.json) return console.log(JSON.stringify(r, null, 2));
      process.stdout.write(r.stdout);
      process.stderr.write(r.stderr);
      if (r.value !== null) console.log(r.value);
      if (r.error) {
        process.stderr.write(r.error.traceback);
        process.exitCode = 1;
      }
    });

  program
    .command("ps")
    .description("list the commands started through the API that still run in a sandbox")
    .argument("<id>")
    .option("--json", "JSON output")
    .action(async (id: string, o: { json?: boolean }) => {
      const { commands } = await (await ctx.ready()).listCommands(id, { timeoutMs: CALL_MS });
      if (o.json) return console.log(JSON.stringify(commands, null, 2));
      printTable(
        ["PID", "STARTED", "STDIN", "CMD"],
        commands.map((c) => [
          String(c.pid),
          c.started,
          c.stdin_open ? "open" : "-",
          typeof c.cmd === "string" ? c.cmd : c.cmd.join(" "),
        ]),
      );
    });

  program
    .command("signal")
    .description("send a signal to a running command's process group (default SIGKILL)")
    .argument("<id>")
    .argument("<pid>", "the command's pid (forkd ps)", Number)
    .argument("[signal]", "name or number, e.g. SIGTERM or 15", "SIGKILL")
    .action(async (id: string, pid: number, sig: string) => {
      // The daemon validates the name or number.
      const signal = (/^\d+$/.test(sig) ? Number(sig) : sig) as Requests["SendSignal"]["signal"];
      await (await ctx.ready()).signal(id, pid, { signal }, { timeoutMs: CALL_MS });
    });

  program
    .command("stdin")
    .description(
      "send this command's standard input to a running command's stdin (started with it kept open)",
    )
    .argument("<id>")
    .argument("<pid>", "the command's pid (forkd ps)", Number)
    .option("--eof", "close its stdin after")
    .action(async (id: string, pid: number, o: { eof?: boolean }) => {
      await (
        await ctx.ready()
      ).sendStdin(id, pid, process.stdin, { eof: o.eof ?? false }, { timeoutMs: TRANSFER_IDLE_MS });
    });
}
