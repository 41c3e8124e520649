/**
 * `forkd console [--port N] [--host 127.0.0.1]`: serves the web console on a loopback address
 * (src/console/server.ts) for the local daemon (started if none answers), prints its one-time
 * login URL as the first line on stdout, and serves until SIGINT or SIGTERM.
 */
import type { Server } from "node:http";
import type { Command } from "commander";
import { InvalidArgumentError } from "commander";
import { usageError } from "../errors.js";
import { consoleDist } from "../../console/assets.js";
import { createConsoleServer } from "../../console/server.js";
import { ConsoleSessions } from "../../console/sessions.js";
import type { CliContext } from "../context.js";

const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1"]);

function parsePort(v: string): number {
  const n = Number(v);
  if (!/^\d+$/.test(v) || n > 65_535) throw new InvalidArgumentError("a port number 0..65535");
  return n;
}

function listen(server: Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      const a = server.address();
      resolve(a && typeof a === "object" ? a.port : port);
    });
  });
}

export function consoleCommand(program: Command, ctx: CliContext): void {
  program
    .command("console")
    .description("serve the web console on a loopback address; prints its one-time login URL first")
    .option("--port <n>", "port to listen on (default: a free one)", parsePort, 0)
    .option("--host <host>", "loopback address to listen on (127.0.0.1, ::1 or localhost)", "127.0.0.1")
    .action(async (o: { port: number; host: string }) => {
      if (!LOOPBACK.has(o.host)) throw usageError(`--host must be a loopback address, not ${o.host}`);
      if (!ctx.api.where.startsWith("unix:"))
        throw usageError(
          "forkd console serves the local daemon; a remote daemon with FORKD_LISTEN serves its console at /console/",
        );
      await ctx.ready();
      const sessions = new ConsoleSessions();
      const urlHost = o.host === "::1" ? "[::1]" : o.host;
      let origin = "";
      const server = createConsoleServer({
        socket: ctx.paths.socket,
        dist: consoleDist(ctx.paths.repoDir),
        sessions,
        origin: () => origin,
      });
      const port = await listen(server, o.port, o.host);
      origin = `http://${urlHost}:${port}`;
      process.stdout.write(`${origin}/console/login?secret=${sessions.newSecret()}\n`);
      ctx.say(`forkd: console at ${origin}/console/ (the URL above logs in once); Ctrl-C stops it`);
      await new Promise<void>((resolve) => {
        const stop = () => {
          process.off("SIGINT", stop);
          process.off("SIGTERM", stop);
          server.close(() => resolve());
          server.closeAllConnections();
        };
        process.once("SIGINT", stop);
        process.once("SIGTERM", stop);
      });
    });
}
