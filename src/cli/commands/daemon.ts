/**
 * The daemon itself and the host: daemon (runs it in the foreground), gateway (a cluster's front
 * door, in the foreground), doctor (host checks, no
 * daemon needed), status (health and versions), openapi (the running daemon's document),
 * metrics.
 */
import type { Command } from "commander";
import type { CliContext } from "../context.js";
import { runDoctor } from "../doctor.js";
import { CALL_MS } from "../timeouts.js";
import { VERSION } from "../../host/index.js";

/** The daemon's entry point (`forkd daemon`, `forkd gateway` run in this process): the CLI's one import of daemon code. */
const entry = () => import("../../daemon/index.js");

export function daemonCommands(program: Command, ctx: CliContext): void {
  program
    .command("daemon")
    .description("run the daemon in the foreground")
    .action(async () => {
      // Starting a daemon process is the one thing the CLI takes from the daemon's code.
      const { runDaemon } = await entry();
      await runDaemon();
    });

  program
    .command("gateway")
    .description(
      "run a cluster's gateway in the foreground: forkd's REST API, E2B's API and the console over every node " +
        "(FORKD_CLUSTER, FORKD_CLUSTER_SECRET_FILE, FORKD_GATEWAY_LISTEN, FORKD_GATEWAY_E2B_LISTEN; docs/cluster.md)",
    )
    .action(async () => {
      const { runGateway } = await entry();
      await runGateway();
    });

  program
    .command("doctor")
    .description("check every host prerequisite; exits non-zero if one fails")
    .option("--json", "machine-readable output")
    .action(async (o: { json?: boolean }) => {
      process.exitCode = await runDoctor(ctx.paths, o.json ?? false);
    });

  program
    .command("status")
    .description("whether the daemon answers, and its version and this CLI's")
    .option("--json", "JSON output")
    .action(async (o: { json?: boolean }) => {
      const api = await ctx.ready();
      const [health, version] = await Promise.all([
        api.health({ timeoutMs: CALL_MS }),
        api.version({ timeoutMs: CALL_MS }),
      ]);
      if (o.json)
        return console.log(JSON.stringify({ cli: VERSION, where: api.where, health, version }, null, 2));
      console.log(
        `daemon at ${api.where}: ${health.ok ? "ok" : "not ok"}, version ${version.version} (API ${version.api}); CLI ${VERSION}`,
      );
    });

  program
    .command("openapi")
    .description("print the running daemon's OpenAPI document (the repository's copy: docs/openapi.json)")
    .action(async () => {
      const doc = await (await ctx.ready()).openapi({ timeoutMs: CALL_MS });
      process.stdout.write(JSON.stringify(doc, null, 2) + "\n");
    });

  program
    .command("metrics")
    .description("print the daemon's Prometheus metrics (admins)")
    .action(async () => {
      process.stdout.write(await (await ctx.ready()).metrics({ timeoutMs: CALL_MS }));
    });
}
