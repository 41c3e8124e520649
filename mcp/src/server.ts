/**
 * The forkd MCP server: tools over the TypeScript SDK (so it only ever talks to the daemon's
 * API). `createServer()` builds a server; main.ts connects it to stdio or streamable HTTP.
 * A tool that fails returns a result with isError and a readable message, never a crash.
 */
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { CommandExitError, CommandTimeoutError, Controller, ForkdError, Sandbox, fork } from "@forkd/sdk";
import type { ConnectionOpts, SandboxInfo } from "@forkd/sdk";
import { z } from "zod";
import { waitForText } from "./wait.js";

export const VERSION = "0.1.0";

/** Bytes of command output, file content or cell output handed to the model per field. */
const MAX_TEXT = 100_000;

const SandboxId = z.string().describe("Sandbox id (sb-...)");
const Tag = z.string().describe("Snapshot tag");

const clip = (s: string) =>
  s.length <= MAX_TEXT ? s : `${s.slice(0, MAX_TEXT)}\n[... ${s.length - MAX_TEXT} more characters cut]`;

const json = (v: unknown): CallToolResult => ({
  content: [{ type: "text", text: JSON.stringify(v, null, 2) }],
});

function failure(e: unknown): CallToolResult {
  const text =
    e instanceof ForkdError
      ? `forkd error (${e.code}): ${e.message}`
      : `error: ${e instanceof Error ? e.message : String(e)}`;
  return { isError: true, content: [{ type: "text", text }] };
}

/** A sandbox as tools report it: snake_case keys, like every other tool result and the REST API. */
const sandboxView = (s: SandboxInfo) => ({
  sandbox_id: s.sandboxId,
  snapshot: s.snapshot,
  pid: s.pid,
  state: s.state,
  started_at: s.startedAt,
  exit_reason: s.exitReason,
  timeout_ms: s.idleTimeoutMs,
  end_at: s.endAt,
  metadata: s.metadata,
  timings: {
    launch_ms: s.timings.launchMs,
    restore_ms: s.timings.restoreMs,
    ready_ms: s.timings.readyMs,
    total_ms: s.timings.totalMs,
  },
  limits: {
    memory_mib: s.limits.memoryMiB,
    cpus: s.limits.cpus,
    pids: s.limits.pids,
    disk_mib: s.limits.diskMiB,
    lifetime_ms: s.limits.lifetimeMs,
  },
  network: {
    mode: s.network.mode,
    guest_ip: s.network.guestIp,
    egress: s.network.egress,
    ports: s.network.ports,
  },
});

/** Runs a tool body; any failure becomes an isError result. */
const guard =
  <A>(fn: (args: A) => Promise<CallToolResult>) =>
  async (args: A): Promise<CallToolResult> => {
    try {
      return await fn(args);
    } catch (e) {
      return failure(e);
    }
  };

export function createServer(conn: ConnectionOpts = {}): McpServer {
  const server = new McpServer({ name: "forkd", version: VERSION });
  const ctl = new Controller(conn);
  const sandbox = (id: string) => Sandbox.connect(id, conn);

  server.registerTool(
    "list_snapshots",
    { description: "List the warm snapshots sandboxes can be forked from.", inputSchema: {} },
    guard(async () =>
      json(
        (await ctl.listSnapshots()).map((s) => ({
          tag: s.tag,
          template: s.template,
          created: s.created,
          source: s.source,
          memory_mib: s.machine.memory_mib,
          warm: s.warm,
          warm_eval: s.warm_eval,
          warm_eval_language: s.warm_eval_language ?? null,
        })),
      ),
    ),
  );

  server.registerTool(
    "create_snapshot",
    {
      description:
        "Boot a parent VM from a template or an OCI/Docker image, optionally start a server in it " +
        "(start_cmd, then ready_cmd until it succeeds), warm it (a shell command and/or a cell " +
        "whose globals every child inherits) and freeze it as a snapshot. Takes seconds with KVM, " +
        "minutes without (an image is pulled first).",
      inputSchema: {
        tag: Tag,
        template: z.string().optional().describe('Guest template (default "python"; not with image)'),
        image: z
          .string()
          .optional()
          .describe('OCI/Docker image reference to boot instead of a template, e.g. "python:3.11"'),
        start_cmd: z
          .string()
          .optional()
          .describe("Shell command started in the background before freezing (a server every child has up)"),
        ready_cmd: z.string().optional().describe("Shell command run until it exits 0 (after start_cmd)"),
        ready_timeout_ms: z.number().int().optional().describe("How long ready_cmd has (default 120000)"),
        warm: z.string().optional().describe("Shell command run before freezing"),
        warm_eval: z.string().optional().describe("Cell run before freezing, in warm_eval_language"),
        warm_eval_language: z
          .enum(["python", "javascript"])
          .optional()
          .describe('The kernel warm_eval runs in (default "python"; javascript needs node in the image)'),
        memory_mib: z.number().int().optional(),
      },
    },
    guard(async (a) => {
      const meta = await ctl.createSnapshot({
        tag: a.tag,
        template: a.template,
        image: a.image,
        startCmd: a.start_cmd,
        readyCmd: a.ready_cmd,
        readyTimeoutMs: a.ready_timeout_ms,
        warm: a.warm,
        warmEval: a.warm_eval,
        warmEvalLanguage: a.warm_eval_language,
        memoryMiB: a.memory_mib,
      });
      return json({ tag: meta.tag, source: meta.source, created: meta.created, timings: meta.timings });
    }),
  );

  server.registerTool(
    "spawn_sandboxes",
    {
      description:
        "Fork n sandboxes from a snapshot (copy-on-write, each with its own disk and identity). " +
        "Returns their ids once every one answers.",
      inputSchema: {
        snapshot: Tag,
        n: z.number().int().min(1).max(100).default(1),
        idle_timeout_ms: z.number().int().optional().describe("Kill a sandbox unused for this long"),
        network: z
          .object({
            mode: z.enum(["none", "user", "netns"]),
            egress: z
              .object({
                mode: z.enum(["deny", "allow", "list"]),
                allow: z
                  .array(
                    z.object({
                      cidr: z.string(),
                      ports: z.array(z.union([z.number(), z.string()])).optional(),
                    }),
                  )
                  .optional(),
                dns: z.boolean().optional(),
              })
              .optional(),
            expose: z.array(z.number().int()).optional(),
          })
          .optional()
          .describe(
            "Network (default none): user or netns, egress deny/allow/list of {cidr, ports}, guest ports to expose " +
              "(get_sandbox then shows where each answers)",
          ),
      },
    },
    guard(async (a) => {
      const kids = await fork(a.snapshot, a.n, {
        ...conn,
        idleTimeoutMs: a.idle_timeout_ms,
        network: a.network,
      });
      return json({ sandbox_ids: kids.map((k) => k.sandboxId) });
    }),
  );

  server.registerTool(
    "list_sandboxes",
    { description: "List sandboxes with their state and snapshot.", inputSchema: {} },
    guard(async () =>
      json(
        (await Sandbox.list(conn)).map((s) => ({
          sandbox_id: s.sandboxId,
          snapshot: s.snapshot,
          state: s.state,
          started_at: s.startedAt,
          exit_reason: s.exitReason,
        })),
      ),
    ),
  );

  server.registerTool(
    "get_sandbox",
    {
      description: "One sandbox's state, snapshot, timings, idle timeout and network (exposed ports).",
      inputSchema: { sandbox_id: SandboxId },
    },
    guard(async (a) => json(sandboxView(await Sandbox.getInfo(a.sandbox_id, conn)))),
  );

  server.registerTool(
    "expose_port",
    {
      description:
        "Make a guest TCP port of a running sandbox reachable from the host (for a server started in " +
        "it); returns host:port. The sandbox needs a network (spawn_sandboxes with network mode user or netns).",
      inputSchema: { sandbox_id: SandboxId, port: z.number().int().min(1).max(65535) },
    },
    guard(async (a) => json({ host: await (await sandbox(a.sandbox_id)).expose(a.port) })),
  );

  server.registerTool(
    "kill_sandbox",
    { description: "Kill a sandbox and delete its files.", inputSchema: { sandbox_id: SandboxId } },
    guard(async (a) => json({ killed: await Sandbox.kill(a.sandbox_id, conn) })),
  );

  server.registerTool(
    "branch_sandbox",
    {
      description:
        "Snapshot a running sandbox (memory, disk, processes, Python state) with a short pause, as a new " +
        "snapshot tag; then spawn_sandboxes from that tag to try several next steps from the same state.",
      inputSchema: {
        sandbox_id: SandboxId,
        tag: z.string().optional().describe("Tag of the new snapshot (default: br-<random>)"),
      },
    },
    guard(async (a) => {
      const sb = await sandbox(a.sandbox_id);
      const b = await sb.branch({ tag: a.tag });
      return json({ tag: b.tag, status: b.status, pause_ms: b.pauseMs });
    }),
  );

  server.registerTool(
    "run_command",
    {
      description:
        "Run a shell command in a sandbox and return its exit code, stdout and stderr. With background, " +
        "return its pid at once (it keeps running).",
      inputSchema: {
        sandbox_id: SandboxId,
        command: z.string().min(1),
        cwd: z.string().optional(),
        env: z.record(z.string(), z.string()).optional(),
        timeout_ms: z.number().int().min(1).default(60_000),
        background: z.boolean().default(false),
      },
    },
    guard(async (a) => {
      const sb = await sandbox(a.sandbox_id);
      const opts = { cwd: a.cwd, envs: a.env, timeoutMs: a.timeout_ms };
      if (a.background) {
        const h = await sb.commands.run(a.command, { ...opts, background: true });
        return json({ pid: h.pid, running: true });
      }
      try {
        const r = await sb.commands.run(a.command, opts);
        return json({ exit_code: r.exitCode, stdout: clip(r.stdout), stderr: clip(r.stderr) });
      } catch (e) {
        // A command that fails or times out is a result the model should see, not a tool failure.
        if (e instanceof CommandExitError || e instanceof CommandTimeoutError) {
          const r = e.result;
          return json({
            exit_code: r.exitCode,
            error: r.error,
            stdout: clip(r.stdout),
            stderr: clip(r.stderr),
          });
        }
        throw e;
      }
    }),
  );

  server.registerTool(
    "run_code",
    {
      description:
        "Run a Python (or, with language javascript, a Node) cell in the sandbox's warm interpreter " +
        "(globals persist across calls; the value of the last expression is returned; figures come " +
        "back as images). JavaScript needs node in the sandbox's image (e.g. the node template).",
      inputSchema: {
        sandbox_id: SandboxId,
        code: z.string(),
        language: z
          .enum(["python", "javascript"])
          .default("python")
          .describe("The kernel to run the cell in"),
        timeout_ms: z.number().int().min(1).default(60_000),
      },
    },
    guard(async (a) => {
      const sb = await sandbox(a.sandbox_id);
      const ex = await sb.runCode(a.code, { language: a.language, timeoutMs: a.timeout_ms });
      const content: CallToolResult["content"] = [
        {
          type: "text",
          text: JSON.stringify(
            {
              result: ex.text ?? null,
              stdout: clip(ex.logs.stdout.join("")),
              stderr: clip(ex.logs.stderr.join("")),
              error: ex.error
                ? { name: ex.error.name, value: ex.error.value, traceback: clip(ex.error.traceback) }
                : null,
            },
            null,
            2,
          ),
        },
      ];
      for (const r of ex.results) {
        if (r.png) content.push({ type: "image", data: r.png, mimeType: "image/png" });
        else if (r.jpeg) content.push({ type: "image", data: r.jpeg, mimeType: "image/jpeg" });
      }
      return { content, isError: ex.error !== undefined };
    }),
  );

  server.registerTool(
    "read_file",
    {
      description: "Read a file from a sandbox (text; binary files come back base64-encoded).",
      inputSchema: { sandbox_id: SandboxId, path: z.string() },
    },
    guard(async (a) => {
      const sb = await sandbox(a.sandbox_id);
      const bytes = await sb.files.read(a.path, { format: "bytes" });
      const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
      const binary = text.includes("\uFFFD");
      return json({
        path: a.path,
        size: bytes.length,
        encoding: binary ? "base64" : "utf8",
        content: clip(binary ? Buffer.from(bytes).toString("base64") : text),
      });
    }),
  );

  server.registerTool(
    "write_file",
    {
      description: "Write a file in a sandbox (parent directories are created; replaced atomically).",
      inputSchema: {
        sandbox_id: SandboxId,
        path: z.string(),
        content: z.string(),
        encoding: z.enum(["utf8", "base64"]).default("utf8"),
      },
    },
    guard(async (a) => {
      const sb = await sandbox(a.sandbox_id);
      const data = a.encoding === "base64" ? Buffer.from(a.content, "base64") : a.content;
      const w = await sb.files.write(a.path, data);
      return json({ path: w.path, size: w.size });
    }),
  );

  server.registerTool(
    "wait_for_text",
    {
      description:
        "Wait until text appears in a file, or in the output of a command re-run until it does " +
        "(e.g. `curl -s localhost:8000/health`). Fails after timeout_ms.",
      inputSchema: {
        sandbox_id: SandboxId,
        text: z.string().min(1),
        path: z.string().optional().describe("File to watch"),
        command: z.string().optional().describe("Command whose output to check"),
        timeout_ms: z.number().int().min(1).max(3_600_000).default(30_000),
        interval_ms: z.number().int().min(50).max(60_000).default(500),
      },
    },
    guard(async (a) => {
      const sb = await sandbox(a.sandbox_id);
      return json(await waitForText(sb, a));
    }),
  );

  return server;
}
