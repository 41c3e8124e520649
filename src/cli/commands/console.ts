/**
 * `forkd console [--port N] [--host 127.0.0.1]`: serves the web console on a loopback address
 * (src/console/server.ts) for the local daemon (started if none answers), prints its one-time
 * login URL as the first line on stdout (each line on stdin prints another), and serves until
 * SIGINT or SIGTERM (which end its open terminals too).
 */
import type { Server } from "node:http";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import type { Command } from "commander";
import { InvalidArgumentError } from "commander";
import { usageError } from "../errors.js";
import { consoleDist } from "../../http/index.js";
import { createConsoleServer, stopConsoleServer } from "../../console/index.js";
import { ConsoleSessions, loopbackCookie } from "../../access/index.js";
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

/**
 * Whether to read stdin for "another URL" lines: a pipe or file always; a terminal only when
 * this process is in its foreground (a job started with `&` that read it would be stopped by
 * SIGTTIN). /proc/self/stat's fields after the name: state ppid pgrp session tty_nr tpgid.
 */
function readsStdin(): boolean {
  if (process.stdin.isTTY !== true) return true;
  try {
    const stat = readFileSync("/proc/self/stat", "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return f[2] !== undefined && f[2] === f[5];
  } catch {
    return false;
  }
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
      let port = 0;
      const server = createConsoleServer({
        socket: ctx.paths.socket,
        dist: consoleDist(ctx.paths.repoDir),
        sessions,
        origin: () => origin,
        cookie: () => loopbackCookie(port),
      });
      port = await listen(server, o.port, o.host);
      origin = `http://${urlHost}:${port}`;
      const loginUrl = () => `${origin}/console/login?secret=${sessions.newSecret()}\n`;
      process.stdout.write(loginUrl());
      // Each line on stdin (Enter at a terminal) prints another one-time URL: another browser,
      // or a login after a logout. Stdin at its end (or /dev/null) changes nothing.
      const lines = readsStdin() ? createInterface({ input: process.stdin, terminal: false }) : null;
      lines?.on("line", () => process.stdout.write(loginUrl()));
      lines?.on("error", () => lines.close());
      ctx.say(
        `forkd: console at ${origin}/console/ (the URL above logs in once${lines ? "; Enter prints another" : ""}); Ctrl-C stops it`,
      );
      await new Promise<void>((resolve) => {
        const stop = () => {
          process.off("SIGINT", stop);
          process.off("SIGTERM", stop);
          if (lines) {
            lines.close();
            process.stdin.destroy();
          }
          void stopConsoleServer(server).then(resolve);
        };
        process.once("SIGINT", stop);
        process.once("SIGTERM", stop);
      });
    });
}
