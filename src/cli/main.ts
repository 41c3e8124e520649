#!/usr/bin/env node
/**
 * forkd CLI: a thin client of the daemon's REST API (and `forkd daemon` runs the daemon).
 * Exit codes: 0 ok; 1 error; 2 usage / invalid argument; exec exits with the guest command's code.
 */
import { createReadStream, createWriteStream, readFileSync } from "node:fs";
import { pipeline } from "node:stream/promises";
import { Command } from "commander";
import { ApiError, apiRequest, checkResponse, rawRequest, readAll, readNdjson } from "../client/http.js";
import { rename, rm, stat } from "node:fs/promises";
import type { Endpoint } from "../client/http.js";
import { defaultPaths } from "../host/paths.js";
import { VERSION } from "../version.js";
import { ensureDaemon } from "./autostart.js";
import { printTable } from "./table.js";
import { runDoctor } from "./doctor.js";
import { quickstart } from "./quickstart.js";
import { snapshotLayer } from "./layer.js";
import { mib, streamTransfer } from "./transfer.js";
import { networkFromFlags } from "./network.js";
import { limitsFromFlags } from "./limits.js";
import type { LimitFlags } from "./limits.js";
import type { NetworkFlags } from "./network.js";
import { buildOpenApi } from "../api/contract/openapi.js";
import { CALL_MS, HEAVY_MS, PROGRESS_IDLE_MS, TRANSFER_IDLE_MS, evalMs, execIdleMs } from "./timeouts.js";

const paths = defaultPaths();
const endpoint: Endpoint = process.env.FORKD_URL
  ? {
      url: process.env.FORKD_URL,
      token: process.env.FORKD_TOKEN,
      ...(process.env.FORKD_CA_CERT ? { ca: readFileSync(process.env.FORKD_CA_CERT) } : {}),
    }
  : { socket: paths.socket };
const say = (s: string) => process.stderr.write(s + "\n");

/** One JSON call; `timeoutMs` as src/cli/timeouts.ts says for its kind. */
async function api<T>(method: string, path: string, body?: unknown, timeoutMs = CALL_MS): Promise<T> {
  await ensureDaemon(paths, endpoint, say);
  return apiRequest<T>(endpoint, method, path, body, timeoutMs);
}

interface SandboxView {
  id: string;
  tag: string;
  pid: number;
  state: string;
  created: string;
  timings: { total_ms: number; ready_ms: number };
  network: { mode: string; ports: Array<{ port: number; host: string }> };
}

const program = new Command("forkd")
  .description("Hardware-isolated sandboxes forked copy-on-write from warm microVM snapshots")
  .version(VERSION);

program
  .command("daemon")
  .description("run the daemon in the foreground")
  .action(async () => {
    const { runDaemon } = await import("../daemon/main.js");
    await runDaemon();
  });

program
  .command("quickstart")
  .description("snapshot a warm Python parent (once), fork N children, run code in each, show timings")
  .option("-n <n>", "number of children", (v) => parseInt(v, 10), 10)
  .option("--tag <tag>", "snapshot tag to use or create", "quickstart")
  .option("--keep", "leave the children running")
  .action(async (o: { n: number; tag: string; keep?: boolean }) => {
    await ensureDaemon(paths, endpoint, say);
    process.exitCode = await quickstart(endpoint, { n: o.n, tag: o.tag, keep: o.keep ?? false }, say);
  });

program
  .command("doctor")
  .description("check every host prerequisite; exits non-zero if one fails")
  .option("--json", "machine-readable output")
  .action(async (o: { json?: boolean }) => {
    process.exitCode = await runDoctor(paths, o.json ?? false);
  });

program
  .command("openapi")
  .description("print the REST API's OpenAPI document (no daemon needed)")
  .action(() => {
    process.stdout.write(JSON.stringify(buildOpenApi(VERSION), null, 2) + "\n");
  });

program
  .command("snapshot")
  .description("boot a parent VM, warm it, and freeze it into a snapshot")
  .requiredOption("--tag <tag>", "snapshot tag")
  .option("--template <name>", "guest template", "python")
  .option("--warm <cmd>", "shell command to run in the parent before freezing")
  .option("--warm-eval <code>", "Python to run in the parent's warm interpreter before freezing")
  .option("--memory <MiB>", "guest RAM in MiB", (v) => parseInt(v, 10), 512)
  .option("--vcpus <n>", "vCPUs", (v) => parseInt(v, 10), 1)
  .option("--from <tag>", "build a layer on an existing snapshot: fork it, run --exec, branch, kill")
  .option("--exec <cmd>", "with --from: shell command that makes the layer")
  .option("--json", "print the snapshot metadata as JSON")
  .action(
    async (o: {
      tag: string;
      template: string;
      warm?: string;
      warmEval?: string;
      memory: number;
      vcpus: number;
      from?: string;
      exec?: string;
      json?: boolean;
    }) => {
      if (o.from !== undefined || o.exec !== undefined) {
        if (o.from === undefined || o.exec === undefined) {
          throw new ApiError(400, "invalid_argument", "--from and --exec go together");
        }
        await ensureDaemon(paths, endpoint, say);
        process.exitCode = await snapshotLayer(
          endpoint,
          { from: o.from, tag: o.tag, exec: o.exec, json: o.json ?? false },
          say,
        );
        return;
      }
      say(`forkd: creating snapshot ${o.tag} (template ${o.template}); the first run builds the guest image`);
      const t0 = Date.now();
      await ensureDaemon(paths, endpoint, say);
      const body = JSON.stringify({
        tag: o.tag,
        template: o.template,
        warm: o.warm,
        warm_eval: o.warmEval,
        memory_mib: o.memory,
        vcpus: o.vcpus,
      });
      const res = await checkResponse(
        await rawRequest(endpoint, "POST", "/v1/snapshots?stream=1", body, PROGRESS_IDLE_MS, {
          "content-type": "application/json",
        }),
      );
      let meta: { tag: string; timings: { boot_ms: number; freeze_ms: number } } | null = null;
      await readNdjson(
        res,
        (ev: {
          type: string;
          message?: string;
          snapshot?: typeof meta;
          error?: { code: string; message: string; details: Record<string, unknown> };
        }) => {
          if (ev.type === "progress")
            say(`  [${((Date.now() - t0) / 1000).toFixed(1)}s] ${ev.message ?? ""}`);
          else if (ev.type === "done") meta = ev.snapshot ?? null;
          else if (ev.type === "error")
            throw new ApiError(
              500,
              ev.error?.code ?? "internal",
              ev.error?.message ?? "snapshot failed",
              ev.error?.details ?? {},
            );
        },
      );
      const m = meta as { tag: string; timings: { boot_ms: number; freeze_ms: number } } | null;
      if (!m) throw new ApiError(500, "internal", "the daemon ended the snapshot stream without a result");
      if (o.json) console.log(JSON.stringify(m, null, 2));
      else
        console.log(
          `snapshot ${m.tag} ready: boot ${Math.round(m.timings.boot_ms)} ms, freeze ${Math.round(m.timings.freeze_ms)} ms, total ${Date.now() - t0} ms`,
        );
    },
  );

program
  .command("fork")
  .description("fork N sandboxes from a snapshot")
  .requiredOption("--tag <tag>", "snapshot tag")
  .option("-n <n>", "number of children (1..1000)", (v) => parseInt(v, 10), 1)
  .option("--net <mode>", "network: none (default), user or netns")
  .option("--egress <mode>", "egress policy: deny, allow (default with a network) or list")
  .option(
    "--allow <cidr[:ports]...>",
    "allow-list entries, e.g. 203.0.113.0/24:443,8000-8100 (implies --egress list)",
  )
  .option("--dns", "answer DNS (default with --egress allow)")
  .option("--no-dns", "do not answer DNS")
  .option("--expose <port...>", "guest TCP ports to expose on the host")
  .option("--memory <mib>", "host memory limit of each VMM in MiB (default guest RAM + 384)", Number)
  .option("--cpus <cores>", "CPU quota of each in cores, e.g. 0.5", parseFloat)
  .option("--pids <n>", "processes of each guest workload (default 1024)", Number)
  .option("--disk <mib>", "host disk each may write, in MiB (default: the snapshot's disk size)", Number)
  .option("--lifetime <s>", "kill each this many seconds after its creation, whatever it does", Number)
  .option("--json", "JSON output")
  .action(async (o: { tag: string; n: number; json?: boolean } & NetworkFlags & LimitFlags) => {
    const t0 = Date.now();
    const network = networkFromFlags(o);
    const limits = limitsFromFlags(o);
    const r = await api<{ sandboxes: SandboxView[]; failures: { index: number; message: string }[] }>(
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: o.tag, n: o.n, ...(network ? { network } : {}), ...(limits ? { limits } : {}) },
      HEAVY_MS,
    );
    if (o.json) {
      console.log(JSON.stringify(r, null, 2));
    } else {
      printTable(
        ["ID", "PID", "TAG", "NET", "READY_MS", "TOTAL_MS", "PORTS"],
        r.sandboxes.map((s) => [
          s.id,
          String(s.pid),
          s.tag,
          s.network.mode,
          String(Math.round(s.timings.ready_ms)),
          String(Math.round(s.timings.total_ms)),
          s.network.ports.map((p) => `${p.port}->${p.host}`).join(" "),
        ]),
      );
      say(`${r.sandboxes.length} of ${o.n} children ready in ${Date.now() - t0} ms`);
      for (const f of r.failures) say(`child ${f.index} failed: ${f.message}`);
    }
    if (r.failures.length > 0) process.exitCode = 1;
  });

program
  .command("ls")
  .description("list sandboxes")
  .option("--json", "JSON output")
  .action(async (o: { json?: boolean }) => {
    const r = await api<{ sandboxes: SandboxView[] }>("GET", "/v1/sandboxes");
    if (o.json) console.log(JSON.stringify(r.sandboxes, null, 2));
    else
      printTable(
        ["ID", "PID", "TAG", "STATE", "CREATED"],
        r.sandboxes.map((s) => [s.id, String(s.pid), s.tag, s.state, s.created]),
      );
  });

program
  .command("egress")
  .description("replace a running sandbox's egress policy (network netns, or user with allow/list)")
  .argument("<id>")
  .requiredOption("--egress <mode>", "deny, allow or list")
  .option("--allow <cidr[:ports]...>", "allow-list entries, e.g. 203.0.113.0/24:443 (with --egress list)")
  .option("--dns", "answer DNS")
  .option("--no-dns", "do not answer DNS")
  .action(async (id: string, o: NetworkFlags) => {
    const egress = (networkFromFlags(o) as { egress?: unknown } | undefined)?.egress;
    const v = await api<SandboxView>("POST", `/v1/sandboxes/${encodeURIComponent(id)}/egress`, egress);
    console.log(JSON.stringify(v.network));
  });

program
  .command("expose")
  .description("expose a guest TCP port of a running sandbox on the host; prints host:port")
  .argument("<id>")
  .argument("<port>", "guest TCP port", Number)
  .option("--remove", "stop exposing it")
  .action(async (id: string, port: number, o: { remove?: boolean }) => {
    const at = `/v1/sandboxes/${encodeURIComponent(id)}/ports`;
    if (o.remove) {
      await api<SandboxView>("DELETE", `${at}/${port}`);
      return;
    }
    const v = await api<SandboxView>("POST", at, { port });
    console.log(v.network.ports.find((p) => p.port === port)?.host ?? "");
  });

program
  .command("kill")
  .description("kill sandboxes")
  .argument("[ids...]")
  .option("--all", "kill every sandbox")
  .action(async (ids: string[], o: { all?: boolean }) => {
    if (o.all)
      ids = (await api<{ sandboxes: SandboxView[] }>("GET", "/v1/sandboxes")).sandboxes.map((s) => s.id);
    else if (ids.length === 0) throw new ApiError(0, "invalid_argument", "name sandboxes to kill, or --all");
    await Promise.all(
      ids.map((id) => api("DELETE", `/v1/sandboxes/${encodeURIComponent(id)}`, undefined, HEAVY_MS)),
    );
  });

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
      await ensureDaemon(paths, endpoint, say);
      const env = Object.fromEntries(
        (o.env ?? []).map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]),
      );
      let stdin: string | undefined;
      if (o.stdin) {
        const chunks: Buffer[] = [];
        for await (const c of process.stdin) chunks.push(c as Buffer);
        stdin = Buffer.concat(chunks).toString("utf8");
      }
      const body = JSON.stringify({
        cmd,
        env: o.env ? env : undefined,
        cwd: o.cwd,
        timeout_ms: o.timeout,
        stdin,
      });
      // Ctrl-C cuts the stream (the daemon then kills the command) and exits 130; a second one
      // kills the CLI at once.
      const interrupt = new AbortController();
      const onInt = () => interrupt.abort();
      process.once("SIGINT", onInt);
      try {
        process.exitCode = await execStream(id, body, execIdleMs(o.timeout), interrupt.signal);
      } catch (e) {
        if (!interrupt.signal.aborted) throw e;
        say("forkd: interrupted; the command is killed");
        process.exitCode = 130;
      } finally {
        process.off("SIGINT", onInt);
      }
    },
  );

/** Runs one exec stream, writing the command's output as it comes; its exit code. */
async function execStream(id: string, body: string, idleMs: number, signal: AbortSignal): Promise<number> {
  const res = await checkResponse(
    await rawRequest(
      endpoint,
      "POST",
      `/v1/sandboxes/${encodeURIComponent(id)}/exec/stream`,
      body,
      idleMs,
      { "content-type": "application/json" },
      signal,
    ),
  );
  let code = 1;
  interface ExecEvent {
    type: string;
    data?: string;
    exit_code?: number | null;
    signal?: number | null;
    timed_out?: boolean;
    error?: { message: string };
  }
  await readNdjson(res, (ev: ExecEvent) => {
    if (ev.type === "stdout") process.stdout.write(Buffer.from(ev.data ?? "", "base64"));
    else if (ev.type === "stderr") process.stderr.write(Buffer.from(ev.data ?? "", "base64"));
    else if (ev.type === "exit") {
      if (ev.timed_out) say("forkd: command timed out");
      code = ev.exit_code ?? 128 + (ev.signal ?? 0);
    } else if (ev.type === "error") {
      say(`forkd: ${ev.error?.message ?? "exec failed"}`);
      code = 1;
    }
  });
  return code;
}

program
  .command("eval")
  .description("run Python code in the sandbox's warm interpreter")
  .argument("<id>")
  .argument("<code>")
  .option("--json", "JSON output")
  .action(async (id: string, code: string, o: { json?: boolean }) => {
    const r = await api<{
      ok: boolean;
      value: string | null;
      stdout: string;
      stderr: string;
      error: { traceback: string } | null;
    }>("POST", `/v1/sandboxes/${encodeURIComponent(id)}/eval`, { code }, evalMs());
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
  .command("cp")
  .description("copy a file into (LOCAL ID:PATH) or out of (ID:PATH LOCAL) a sandbox")
  .argument("<src>")
  .argument("<dst>")
  .action(async (src: string, dst: string) => {
    await ensureDaemon(paths, endpoint, say);
    const remote = (s: string) => /^(sb-[a-z2-7]{16}):(\/.*)$/.exec(s);
    const from = remote(src);
    const to = remote(dst);
    if (from && !to) {
      const res = await checkResponse(
        await rawRequest(
          endpoint,
          "GET",
          `/v1/sandboxes/${from[1]}/files?path=${encodeURIComponent(from[2]!)}`,
          undefined,
          TRANSFER_IDLE_MS,
        ),
      );
      await pipeline(res, dst === "-" ? process.stdout : createWriteStream(dst));
    } else if (to && !from) {
      const res = await rawRequest(
        endpoint,
        "PUT",
        `/v1/sandboxes/${to[1]}/files?path=${encodeURIComponent(to[2]!)}&parents=1`,
        src === "-" ? process.stdin : createReadStream(src),
        TRANSFER_IDLE_MS,
        { "content-type": "application/octet-stream" },
      );
      await checkResponse(res);
    } else {
      throw new ApiError(0, "invalid_argument", "exactly one of SRC and DST must be ID:/absolute/path");
    }
  });

program
  .command("images")
  .description("list snapshots")
  .option("--json", "JSON output")
  .action(async (o: { json?: boolean }) => {
    const r = await api<{
      snapshots: {
        tag: string;
        template: string;
        created: string;
        machine: { memory_mib: number; vcpus: number; accel: string };
        files: { memory: { size: number } };
        parent?: { tag: string } | null;
      }[];
      pending: { tag: string; status: string; started: string; error: { message: string } | null }[];
    }>("GET", "/v1/snapshots");
    if (o.json) console.log(JSON.stringify(r, null, 2));
    else
      printTable(
        ["TAG", "STATUS", "PARENT", "TEMPLATE", "MEMORY", "VCPUS", "ACCEL", "CREATED"],
        [
          ...r.snapshots.map((s) => [
            s.tag,
            "ready",
            s.parent?.tag ?? "-",
            s.template,
            `${s.machine.memory_mib}M`,
            String(s.machine.vcpus),
            s.machine.accel,
            s.created,
          ]),
          ...r.pending.map((p) => [p.tag, p.status, "-", "-", "-", "-", "-", p.started]),
        ],
      );
  });

for (const [verb, what] of [
  ["pause", "save a running sandbox's whole state to disk and stop its VM (frees its memory)"],
  ["resume", "bring a paused sandbox back (same id, files and processes)"],
] as const) {
  program
    .command(verb)
    .description(what)
    .argument("<ids...>")
    .action(async (ids: string[]) => {
      for (const id of ids) {
        const v = await api<{ id: string; state: string }>(
          "POST",
          `/v1/sandboxes/${encodeURIComponent(id)}/${verb}`,
          undefined,
          HEAVY_MS,
        );
        console.log(`${v.id} ${v.state}`);
      }
    });
}

program
  .command("pack")
  .description(
    "write a snapshot (its chain, disk layers and guest image) to a file that restores on another host",
  )
  .argument("<tag>")
  .requiredOption("-o, --output <file>", "the pack file to write")
  .action(async (tag: string, o: { output: string }) => {
    await ensureDaemon(paths, endpoint, say);
    const res = await checkResponse(
      await rawRequest(
        endpoint,
        "GET",
        `/v1/snapshots/${encodeURIComponent(tag)}/pack`,
        undefined,
        TRANSFER_IDLE_MS,
      ),
    );
    const tmp = `${o.output}.partial-${process.pid}`;
    try {
      await pipeline(res, createWriteStream(tmp, { flags: "wx" }));
      await rename(tmp, o.output);
    } catch (e) {
      await rm(tmp, { force: true });
      throw e;
    }
    say(`forkd: wrote ${o.output} (${((await stat(o.output)).size / 2 ** 20).toFixed(1)} MiB)`);
  });

program
  .command("unpack")
  .description("register the snapshot in a pack file (verified first; all or nothing)")
  .argument("<file>")
  .action(async (file: string) => {
    await ensureDaemon(paths, endpoint, say);
    await stat(file); // a missing file is the user's error, before any request
    const res = await checkResponse(
      await rawRequest(endpoint, "POST", "/v1/snapshots/unpack", createReadStream(file), TRANSFER_IDLE_MS, {
        "content-type": "application/octet-stream",
      }),
    );
    const r = JSON.parse((await readAll(res)).toString("utf8")) as { tag: string; published: string[] };
    console.log(`${r.tag} ready (registered: ${r.published.join(", ") || "nothing new"})`);
  });

program
  .command("push")
  .description(
    "push a snapshot (its chain, disk layers and guest image) to an OCI registry; only missing blobs are uploaded",
  )
  .argument("<tag>")
  .argument("<ref>", "HOST[:PORT]/NAME[:TAG]")
  .option("--insecure", "allow plain http to a registry that is not on loopback")
  .option("--json", "print the result as JSON")
  .action(async (tag: string, ref: string, o: { insecure?: boolean; json?: boolean }) => {
    await ensureDaemon(paths, endpoint, say);
    const r = await streamTransfer<{
      ref: string;
      digest: string;
      blobs: { total: number; uploaded: number; mounted: number; skipped: number };
      bytes: { uploaded: number; skipped: number };
    }>(
      endpoint,
      `/v1/snapshots/${encodeURIComponent(tag)}/push`,
      { ref, insecure: o.insecure ?? false },
      say,
    );
    if (o.json) return console.log(JSON.stringify(r, null, 2));
    console.log(
      `${r.ref}@${r.digest}: ${r.blobs.uploaded} of ${r.blobs.total} blobs uploaded (${mib(r.bytes.uploaded)}), ` +
        `${r.blobs.skipped} already there, ${r.blobs.mounted} mounted`,
    );
  });

program
  .command("pull")
  .description(
    "register a snapshot from an OCI registry, or from a pack file at an https URL (verified first; all or nothing)",
  )
  .argument("<source>", "HOST[:PORT]/NAME[:TAG|@DIGEST], or https://…/FILE.tar.zst")
  .option("--tag <tag>", "register the snapshot under this tag (its ancestors keep theirs)")
  .option("--insecure", "allow plain http to a host that is not on loopback")
  .option("--json", "print the result as JSON")
  .action(async (source: string, o: { tag?: string; insecure?: boolean; json?: boolean }) => {
    await ensureDaemon(paths, endpoint, say);
    const isUrl = /^[a-z][a-z0-9+.-]*:\/\//i.test(source);
    const r = await streamTransfer<{
      tag: string;
      published: string[];
      blobs: { total: number; downloaded: number; reused: number };
      bytes: { downloaded: number };
    }>(
      endpoint,
      "/v1/snapshots/pull",
      { ...(isUrl ? { url: source } : { ref: source }), tag: o.tag, insecure: o.insecure ?? false },
      say,
    );
    if (o.json) return console.log(JSON.stringify(r, null, 2));
    console.log(
      `${r.tag} ready (registered: ${r.published.join(", ") || "nothing new"}; ` +
        `${r.blobs.downloaded} downloaded (${mib(r.bytes.downloaded)}), ${r.blobs.reused} here already)`,
    );
  });

program
  .command("branch")
  .description("snapshot a running sandbox (short pause) as a new tag to fork from")
  .argument("<id>")
  .option("--tag <tag>", "tag of the new snapshot (default: br-<random>)")
  .option("--no-wait", "return as soon as the sandbox runs again; the snapshot finishes in the background")
  .option("--json", "JSON output")
  .action(async (id: string, o: { tag?: string; wait: boolean; json?: boolean }) => {
    const r = await api<{ tag: string; status: string; pause_ms: number; private_bytes: number }>(
      "POST",
      `/v1/sandboxes/${encodeURIComponent(id)}/branch`,
      { ...(o.tag ? { tag: o.tag } : {}), wait: o.wait },
      HEAVY_MS,
    );
    if (o.json) console.log(JSON.stringify(r, null, 2));
    else
      console.log(
        `${r.tag} ${r.status}: paused ${r.pause_ms.toFixed(1)} ms, ${(r.private_bytes / 2 ** 20).toFixed(1)} MiB private memory`,
      );
  });

program
  .command("rmi")
  .description("delete snapshots")
  .argument("<tags...>")
  .action(async (tags: string[]) => {
    for (const t of tags) await api("DELETE", `/v1/snapshots/${encodeURIComponent(t)}`);
  });

const token = program.command("token").description("API tokens for TCP callers (admin only)");

token
  .command("create")
  .description("create a token for a tenant; prints the token (shown only this once) on stdout")
  .requiredOption("--tenant <name>", "the tenant it acts for (lowercase letters, digits, _ . -)")
  .option("--admin", "an admin token: every tenant's sandboxes, token management, /metrics")
  .option("--max-sandboxes <n>", "sandboxes the tenant may hold at once", (v) => parseInt(v, 10))
  .option("--json", "JSON output (token and its record)")
  .action(async (o: { tenant: string; admin?: boolean; maxSandboxes?: number; json?: boolean }) => {
    const r = await api<{ token: string; info: { id: string; tenant: string; scope: string } }>(
      "POST",
      "/v1/tokens",
      {
        tenant: o.tenant,
        scope: o.admin ? "admin" : "tenant",
        ...(o.maxSandboxes !== undefined ? { max_sandboxes: o.maxSandboxes } : {}),
      },
    );
    if (o.json) console.log(JSON.stringify(r, null, 2));
    else {
      say(`forkd: token ${r.info.id} for ${r.info.scope} ${r.info.tenant}; it is not shown again`);
      console.log(r.token);
    }
  });

token
  .command("ls")
  .description("list tokens (never their secrets)")
  .option("--json", "JSON output")
  .action(async (o: { json?: boolean }) => {
    const { tokens } = await api<{
      tokens: { id: string; tenant: string; scope: string; created: string; max_sandboxes?: number }[];
    }>("GET", "/v1/tokens");
    if (o.json) console.log(JSON.stringify(tokens, null, 2));
    else
      printTable(
        ["ID", "TENANT", "SCOPE", "MAX SANDBOXES", "CREATED"],
        tokens.map((t) => [t.id, t.tenant, t.scope, String(t.max_sandboxes ?? "-"), t.created]),
      );
  });

token
  .command("revoke")
  .description("revoke tokens: refused from the next request on")
  .argument("<ids...>")
  .action(async (ids: string[]) => {
    for (const id of ids) await api("DELETE", `/v1/tokens/${encodeURIComponent(id)}`);
  });

program.parseAsync(process.argv).catch((e: unknown) => {
  if (e instanceof ApiError) {
    say(`forkd: ${e.message}${e.code ? ` [${e.code}]` : ""}`);
    const tail = e.details.console_tail;
    if (typeof tail === "string") say(`guest console:\n${tail}`);
    process.exit(e.code === "invalid_argument" ? 2 : e.code === "not_found" ? 3 : 1);
  }
  say(`forkd: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
