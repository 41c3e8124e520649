/** Sandboxes: fork, ls (each one's node, in a cluster), inspect, kill, pause, resume, timeout, egress, expose. */
import type { Command } from "commander";
import type { Wire } from "@forkd/sdk";
import type { CliContext } from "../context.js";
import { usageError } from "../errors.js";
import { limitsFromFlags } from "../limits.js";
import type { LimitFlags } from "../limits.js";
import { networkFromFlags } from "../network.js";
import type { NetworkFlags } from "../network.js";
import { ProgressView } from "../progress.js";
import { printTable } from "../table.js";
import { CALL_MS, HEAVY_MS } from "../timeouts.js";

/** The NODE column is shown only when some sandbox runs in a cluster (one daemon's name no node). */
const inCluster = (sandboxes: readonly { node: string | null }[]): boolean =>
  sandboxes.some((s) => s.node !== null);

export function sandboxCommands(program: Command, ctx: CliContext): void {
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
    .option("--timeout <s>", "idle timeout: kill each when no API call used it for this long", Number)
    .option("--on-idle <what>", "what the idle timeout does: kill (default) or pause")
    .option("--json", "JSON output")
    .action(
      async (
        o: { tag: string; n: number; json?: boolean; timeout?: number; onIdle?: string } & NetworkFlags &
          LimitFlags,
      ) => {
        const network = networkFromFlags(o);
        const limits = limitsFromFlags(o);
        const api = await ctx.ready();
        const t0 = Date.now();
        // The daemon answers when every child answers (or failed): the wait is all there is to show.
        const view = new ProgressView(ctx.progressOut);
        view.local({
          phase: "fork",
          message: `forking ${o.n} from ${o.tag}; each answers when its agent does`,
        });
        let r: Wire["ForkResult"];
        try {
          r = await api.fork(
            {
              snapshot_tag: o.tag,
              n: o.n,
              ...(o.timeout !== undefined ? { timeout_ms: Math.round(o.timeout * 1000) } : {}),
              ...(o.onIdle !== undefined ? { on_idle: o.onIdle as "kill" | "pause" } : {}),
              ...(network ? { network: network as Wire["NetworkRequest"] } : {}),
              ...(limits ? { limits } : {}),
            },
            { timeoutMs: HEAVY_MS },
          );
        } finally {
          view.end();
        }
        if (o.json) {
          console.log(JSON.stringify(r, null, 2));
        } else {
          const node = inCluster(r.sandboxes);
          printTable(
            ["ID", "PID", "TAG", ...(node ? ["NODE"] : []), "NET", "READY_MS", "TOTAL_MS", "PORTS"],
            r.sandboxes.map((s) => [
              s.id,
              String(s.pid),
              s.tag,
              ...(node ? [s.node ?? "-"] : []),
              s.network.mode,
              String(Math.round(s.timings.ready_ms)),
              String(Math.round(s.timings.total_ms)),
              s.network.ports.map((p) => `${p.port}->${p.host}`).join(" "),
            ]),
          );
          ctx.say(`${r.sandboxes.length} of ${o.n} children ready in ${Date.now() - t0} ms`);
          for (const f of r.failures) ctx.say(`child ${f.index} failed: ${f.message}`);
        }
        if (r.failures.length > 0) process.exitCode = 1;
      },
    );

  program
    .command("ls")
    .description("list sandboxes")
    .option("--json", "JSON output")
    .action(async (o: { json?: boolean }) => {
      const r = await (await ctx.ready()).listSandboxes({ timeoutMs: CALL_MS });
      if (o.json) {
        console.log(JSON.stringify(r.sandboxes, null, 2));
        return;
      }
      const node = inCluster(r.sandboxes);
      printTable(
        ["ID", "PID", "TAG", "STATE", ...(node ? ["NODE"] : []), "CREATED"],
        r.sandboxes.map((s) => [
          s.id,
          String(s.pid),
          s.tag,
          s.state,
          ...(node ? [s.node ?? "-"] : []),
          s.created,
        ]),
      );
    });

  program
    .command("inspect")
    .description("print a sandbox's view as JSON (also one that exited: exit_reason says why)")
    .argument("<id>")
    .action(async (id: string) => {
      console.log(JSON.stringify(await (await ctx.ready()).getSandbox(id, { timeoutMs: CALL_MS }), null, 2));
    });

  program
    .command("kill")
    .description("kill sandboxes")
    .argument("[ids...]")
    .option("--all", "kill every sandbox")
    .action(async (ids: string[], o: { all?: boolean }) => {
      const api = await ctx.ready();
      if (o.all) ids = (await api.listSandboxes({ timeoutMs: CALL_MS })).sandboxes.map((s) => s.id);
      else if (ids.length === 0) throw usageError("name sandboxes to kill, or --all");
      await Promise.all(ids.map((id) => api.kill(id, { timeoutMs: HEAVY_MS })));
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
        const api = await ctx.ready();
        for (const id of ids) {
          const v = await (verb === "pause"
            ? api.pause(id, { timeoutMs: HEAVY_MS })
            : api.resume(id, { timeoutMs: HEAVY_MS }));
          console.log(`${v.id} ${v.state}`);
        }
      });
  }

  program
    .command("timeout")
    .description("set a sandbox's idle timeout, counted from now ('none': never)")
    .argument("<id>")
    .argument("<seconds>", "seconds, or none")
    .action(async (id: string, seconds: string) => {
      const ms = seconds === "none" ? null : Math.round(Number(seconds) * 1000);
      if (ms !== null && !Number.isFinite(ms)) throw usageError(`not a number of seconds: ${seconds}`);
      const v = await (await ctx.ready()).setTimeout(id, { timeout_ms: ms }, { timeoutMs: CALL_MS });
      console.log(`${v.id} ${v.expires_at === null ? "no idle timeout" : `expires at ${v.expires_at}`}`);
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
      const v = await (
        await ctx.ready()
      ).setEgress(id, egress as Wire["EgressRequest"], { timeoutMs: CALL_MS });
      console.log(JSON.stringify(v.network));
    });

  program
    .command("expose")
    .description("expose a guest TCP port of a running sandbox on the host; prints host:port")
    .argument("<id>")
    .argument("<port>", "guest TCP port", Number)
    .option("--remove", "stop exposing it")
    .action(async (id: string, port: number, o: { remove?: boolean }) => {
      const api = await ctx.ready();
      if (o.remove) {
        await api.unexpose(id, port, { timeoutMs: CALL_MS });
        return;
      }
      const v = await api.expose(id, { port }, { timeoutMs: CALL_MS });
      console.log(v.network.ports.find((p) => p.port === port)?.host ?? "");
    });
}
