/**
 * envd's handler served on 127.0.0.1 over a stand-in for a sandbox's guest agent that runs
 * commands and touches files on this host (in a temporary home): E2B's own SDK and a Connect
 * client drive envd's wire without a VM. Commands and file requests ignore `user` (they run as
 * the test's user; each file request's user is recorded); the guest's integration test covers
 * that. `fileUsers: false` stands for an agent older than file users (envd then uses helpers).
 */
import { spawn } from "node:child_process";
import { watch as watchFs } from "node:fs";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { lstat, mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { OpenStreams } from "../../src/access/open-streams.js";
import type { E2bServices as Services } from "../../src/e2b/context.js";
import type { AgentClient, ExecHandle, ExecHandlers, ExecRequest } from "../../src/agent/client.js";
import { startCommand } from "../../src/sandbox/commands/start.js";
import { CommandTable } from "../../src/sandbox/commands/table.js";
import { ForkdError } from "../../src/util/errors.js";
import { envdHandler } from "../../src/e2b/envd/handler.js";
import { envdState } from "../../src/e2b/envd/context.js";
import type { SandboxAccess } from "../../src/e2b/plane-target.js";

export const SANDBOX_ID = "sb-abcdefghijklmnop";
/** The credential every request to the host comes by (what a revocation names). */
export const HOST_CREDENTIAL = "token:tok-hosthosthost";

function fsError(e: unknown, path: string): ForkdError {
  const code = (e as { code?: string }).code;
  if (code === "ENOENT")
    return new ForkdError("not_found", `${path}: no such file`, { errno: 2, errno_name: "ENOENT" });
  if (code === "EEXIST")
    return new ForkdError("conflict", `${path}: exists`, { errno: 17, errno_name: "EEXIST" });
  return new ForkdError("guest_error", `${path}: ${String(code)}`);
}

/** What envd asked of the stand-in agent: each exec's argv and user, each read's path and user. */
export interface AgentLog {
  execs: Array<{ argv: string[]; user: string | undefined }>;
  reads: Array<{ path: string; user: string | undefined }>;
}

/** The guest agent's methods envd uses, on this host. */
function hostAgent(home: string, log: AgentLog, o: { fileUsers: boolean; userUid?: number }) {
  const ids = `${o.userUid ?? process.getuid?.() ?? 0}:${process.getgid?.() ?? 0}`;
  const passwd = `root:x:0:0:root:/root:/bin/bash\nuser:x:${ids}::${home}:/bin/bash\nother:x:${ids}::${home}/other:/bin/bash\n`;
  return {
    async fileUsers() {
      return o.fileUsers;
    },
    exec(req: ExecRequest, h: ExecHandlers = {}): ExecHandle {
      const [cmd = "/bin/false", ...args] = req.argv ?? ["/bin/sh", "-c", req.shell ?? ""];
      log.execs.push({ argv: [cmd, ...args], user: req.user });
      const child = spawn(cmd, args, {
        cwd: req.cwd,
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...req.env },
        stdio: [req.stdin || req.pty ? "pipe" : "ignore", "pipe", "pipe"],
      });
      const started = new Promise<{ pid: number }>((resolve, reject) => {
        child.once("spawn", () => resolve({ pid: child.pid ?? -1 }));
        child.once("error", (e) =>
          reject(new ForkdError("guest_error", `cannot start ${cmd}: ${e.message}`)),
        );
      });
      child.stdout?.on("data", (d: Buffer) => void h.onStdout?.(d));
      child.stderr?.on("data", (d: Buffer) => void h.onStderr?.(d));
      const result = started.then(
        () =>
          new Promise<{ exitCode: number | null; signal: number | null; timedOut: boolean }>((resolve) =>
            child.once("close", (code, sig) =>
              resolve({
                exitCode: code,
                signal: sig === null ? null : sig === "SIGKILL" ? 9 : 15,
                timedOut: false,
              }),
            ),
          ),
      );
      return {
        started,
        result,
        writeStdin: (d) => void child.stdin?.write(d),
        closeStdin: () => void child.stdin?.end(),
        signal: (n) => void child.kill(n),
        resize: () => undefined,
      };
    },
    async readFile(path: string) {
      if (path === "/etc/passwd") return Buffer.from(passwd);
      return readFile(path);
    },
    async readFileStream(path: string, onChunk: (c: Buffer) => unknown, _t?: number, user?: string) {
      log.reads.push({ path, user });
      const b = await readFile(path).catch((e: unknown) => {
        throw fsError(e, path);
      });
      for (let i = 0; i < b.length; i += 65536) await onChunk(b.subarray(i, i + 65536));
      return b.length;
    },
    async stat(path: string) {
      const st = await lstat(path).catch((e: unknown) => {
        throw fsError(e, path);
      });
      const type = st.isFile()
        ? "file"
        : st.isDirectory()
          ? "dir"
          : st.isSymbolicLink()
            ? "symlink"
            : "other";
      return { type, size: st.size, mode: st.mode & 0o7777, mtimeMs: st.mtimeMs };
    },
    async writeFile(
      path: string,
      data: Uint8Array | AsyncIterable<Uint8Array>,
      o: { makeParents?: boolean } = {},
    ) {
      const parts: Uint8Array[] = [];
      if (data instanceof Uint8Array) parts.push(data);
      else for await (const c of data) parts.push(c);
      if (o.makeParents) await mkdir(dirname(path), { recursive: true });
      const b = Buffer.concat(parts);
      await writeFile(path, b);
      return b.length;
    },
    async rename(a: string, b: string) {
      await rename(a, b).catch((e: unknown) => {
        throw fsError(e, a);
      });
    },
    /** inotify's stand-in: fs.watch (a `rename` of a path that exists is a create). */
    watch(
      dir: string,
      opts: { recursive?: boolean },
      onEvent: (e: { type: string; path: string }) => unknown,
    ) {
      let stop!: () => void;
      const done = new Promise<void>((resolve) => (stop = resolve));
      const w = watchFs(dir, { recursive: opts.recursive ?? false }, (kind, name) => {
        if (!name) return;
        const path = join(dir, name);
        if (kind === "change") return void onEvent({ type: "write", path });
        lstat(path).then(
          () => onEvent({ type: "create", path }),
          () => onEvent({ type: "remove", path }),
        );
      });
      void done.then(() => w.close());
      return { ready: Promise.resolve(), done, stop: () => stop() };
    },
    async remove(path: string) {
      await lstat(path).catch((e: unknown) => {
        throw fsError(e, path);
      });
      await rm(path, { recursive: true, force: true });
    },
  };
}

export interface EnvdHost {
  url: string;
  home: string;
  /** Leases taken and not yet released. */
  leased: () => number;
  /** What envd asked of the stand-in agent. */
  log: AgentLog;
  /** What callers opened, by credential (src/access/open-streams.ts). */
  opened: OpenStreams;
  /** Starts a command as forkd's own API does (through the sandbox's command registry): its pid. */
  startTracked(shell: string, env?: Record<string, string>): Promise<number>;
  /** The sandbox's command registry (every door's commands). */
  commands: CommandTable;
  /** What the metrics were told: commands' latencies (seconds) and failures (`op:reason`). */
  metrics: { exec: number[]; failures: string[] };
  close(): Promise<void>;
}

/**
 * `bodyIdleMs`: how long an upload may stall (envd's default otherwise); `userUid`: the uid of
 * the accounts `user` and `other` (default the test's own); `fileUsers`: whether the agent acts
 * as users on files (default yes).
 */
export async function envdHost(
  o: { bodyIdleMs?: number; userUid?: number; fileUsers?: boolean } = {},
): Promise<EnvdHost> {
  const home = await mkdtemp(join(tmpdir(), "forkd-envd-"));
  const log: AgentLog = { execs: [], reads: [] };
  const agent = hostAgent(home, log, { fileUsers: o.fileUsers ?? true, userUid: o.userUid });
  const commands = new CommandTable();
  let leased = 0;
  const record = { id: SANDBOX_ID, env: { FROM_SANDBOX: "yes" } };
  const metrics = { exec: [] as number[], failures: [] as string[] };
  const services = {
    sandboxes: {
      lease: (id: string) => {
        if (id !== SANDBOX_ID) throw new ForkdError("not_found", `sandbox ${id} not found`);
        leased++;
        let done = false;
        return {
          agent,
          commands,
          explain: async (e: unknown) => e,
          release: () => {
            if (!done) leased--;
            done = true;
          },
        };
      },
      get: () => ({ record, commands }),
    },
    limits: { body: { upload: 64 << 20 } },
    metrics: {
      exec: (seconds: number) => void metrics.exec.push(seconds),
      failure: (op: string, reason: string) => void metrics.failures.push(`${op}:${reason}`),
    },
  } as unknown as Services;
  const st = envdState(services);
  if (o.bodyIdleMs !== undefined) st.bodyIdleMs = o.bodyIdleMs;
  const envd = envdHandler(services, st);
  const access = { sandbox: { record }, caller: { credential: HOST_CREDENTIAL } } as unknown as SandboxAccess;
  const server: Server = createServer((req, res) =>
    envd.handle(req, res, { sandboxId: SANDBOX_ID, port: 49983 }, access),
  );
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    home,
    leased: () => leased,
    log,
    opened: st.opened,
    startTracked: async (shell, env) => {
      const lease = { agent: agent as unknown as AgentClient, commands, explain: async (e: unknown) => e };
      const req = { shell, ...(env ? { env } : {}) };
      const { handle } = startCommand(lease, req, {
        spec: { door: "api", ...(env ? { env } : {}) },
        keepStdinOpen: false,
      });
      return (await handle.started).pid;
    },
    commands,
    metrics,
    close: async () => {
      envd.close();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      await rm(home, { recursive: true, force: true });
    },
  };
}
