/**
 * GET /v1/sandboxes/{id}/terminal: a WebSocket to a PTY command in the guest (default a login
 * bash if the image has one, else sh), started through the same core as exec/stream with `pty`
 * (./exec.ts startExec: the sandbox's command registry lists it, door `terminal`, and it can be
 * signalled, written to and attached to from REST and E2B's envd; the sandbox leased while it runs).
 * Binary frames both ways are the terminal's bytes; a client's text frame is JSON control
 * (`{"type":"resize","rows","cols"}`); the server ends with the text frame
 * `{"type":"exit","exit_code"}` (or `{"type":"error","error"}`) and closes 1000. A client that
 * closes kills the command. While the socket's unsent output is past a bound, the guest's
 * output waits (the agent's window stops it in the guest).
 */
import { Hono } from "hono";
import type { WebSocket } from "ws";
import type { ExecHandle } from "../../agent/index.js";
import { ForkdError, errorMessage } from "../../util/index.js";
import { Exec, TerminalQuery } from "../contract/schemas.js";
import type { ApiEnv } from "../env.js";
import { toEnvelope } from "../errors.js";
import { parseQuery } from "../parse.js";
import type { Services } from "../../app/index.js";
import { startExec } from "./exec.js";

/** Unsent output past which the guest's output waits. */
const HIGH_WATER = 1 << 20;
const POLL_MS = 20;
/** A ping each period; a client that has not answered the last one by the next is gone. */
const PING_MS = 30_000;
const DEFAULT_SHELL = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh; fi";

/** Resolves once `ws` has sent enough of its queue (or closed). */
function drained(ws: WebSocket): Promise<void> {
  return new Promise((resolve) => {
    const check = () => {
      if (ws.readyState !== ws.OPEN || ws.bufferedAmount < HIGH_WATER / 2) resolve();
      else setTimeout(check, POLL_MS);
    };
    check();
  });
}

function parseControl(text: string): { rows: number; cols: number } | null {
  try {
    const m = JSON.parse(text) as { type?: unknown; rows?: unknown; cols?: unknown };
    const ok = (n: unknown): n is number =>
      Number.isInteger(n) && (n as number) >= 1 && (n as number) <= 65535;
    if (m.type === "resize" && ok(m.rows) && ok(m.cols)) return { rows: m.rows, cols: m.cols };
  } catch {
    /* not JSON: ignored like an unknown control */
  }
  return null;
}

export function terminalRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();
  app.get("/:id/terminal", (c) => {
    const id = c.req.param("id");
    const q = parseQuery(c, TerminalQuery);
    const upgrade = c.env?.wsUpgrade;
    if (!upgrade || c.req.header("upgrade")?.toLowerCase() !== "websocket")
      throw new ForkdError(
        "invalid_argument",
        "the terminal is a WebSocket: send an Upgrade: websocket request",
      );
    const sb = s.sandboxes.get(id);
    if (sb.state !== "running")
      throw new ForkdError("conflict", `sandbox ${id} is not running (${sb.exitReason ?? sb.state})`, {
        id,
        state: sb.state,
      });
    const body = Exec.parse({
      cmd: q.cmd ?? DEFAULT_SHELL,
      env: { TERM: "xterm-256color" },
      pty: { rows: Number(q.rows ?? 24), cols: Number(q.cols ?? 80) },
    });
    upgrade.accept((ws) => {
      const finish = (frame: unknown) => {
        if (ws.readyState !== ws.OPEN) return;
        ws.send(JSON.stringify(frame));
        ws.close(1000);
      };
      let lease;
      try {
        lease = s.sandboxes.lease(id);
      } catch (e) {
        return finish({ type: "error", ...toEnvelope(e).body });
      }
      const l = lease;
      let handle: ExecHandle;
      try {
        ({ handle } = startExec(
          l,
          body,
          {
            onStdout: (d) => {
              if (ws.readyState !== ws.OPEN) return;
              ws.send(d, { binary: true });
              return ws.bufferedAmount > HIGH_WATER ? drained(ws) : undefined;
            },
          },
          "terminal",
        ));
      } catch (e) {
        l.release();
        return finish({ type: "error", ...toEnvelope(e).body });
      }
      let ended = false;
      ws.on("message", (data, isBinary) => {
        if (ended) return;
        const bytes = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as ArrayBuffer);
        if (isBinary) {
          handle.writeStdin(bytes);
          // No more frames are read until the agent's connection takes more: a client typing
          // faster than the guest reads waits in its own socket, not in the daemon's memory.
          ws.pause();
          l.agent.drain().then(
            () => ws.resume(),
            () => ws.resume(),
          );
          return;
        }
        const size = parseControl(bytes.toString("utf8"));
        if (size) handle.resize(size.rows, size.cols);
      });
      // A half-open client (its host gone, or not reading: pings wait behind unread output)
      // would hold the command and the sandbox's lease for as long as TCP keeps the socket.
      let alive = true;
      ws.on("pong", () => {
        alive = true;
      });
      const pinger = setInterval(() => {
        if (ws.readyState !== ws.OPEN) return; // closing: ping() would throw
        if (!alive) return ws.terminate();
        alive = false;
        ws.ping();
      }, PING_MS);
      // The client went away (or broke the protocol): its command does not outlive it.
      ws.on("close", () => {
        clearInterval(pinger);
        if (!ended) handle.signal(9);
      });
      ws.on("error", () => ws.terminate());
      handle.result
        .then(
          (r) => finish({ type: "exit", exit_code: r.exitCode, signal: r.signal }),
          async (e: unknown) => finish({ type: "error", ...toEnvelope(await l.explain(e)).body }),
        )
        .finally(() => {
          ended = true;
          l.release();
        })
        .catch((e: unknown) => s.log.warn("terminal: exit not sent", { id, error: errorMessage(e) }));
    });
    return c.body(null, 200);
  });
  return app;
}
