/** `forkd token create|ls|revoke`: API tokens for TCP callers (admins only). */
import type { Command } from "commander";
import type { CliContext } from "../context.js";
import { printTable } from "../table.js";
import { CALL_MS } from "../timeouts.js";

export function tokenCommands(program: Command, ctx: CliContext): void {
  const token = program.command("token").description("API tokens for TCP callers (admin only)");

  token
    .command("create")
    .description("create a token for a tenant; prints the token (shown only this once) on stdout")
    .requiredOption("--tenant <name>", "the tenant it acts for (lowercase letters, digits, _ . -)")
    .option("--admin", "an admin token: every tenant's sandboxes, token management, /metrics")
    .option("--max-sandboxes <n>", "sandboxes the tenant may hold at once", (v) => parseInt(v, 10))
    .option("--max-memory-mib <n>", "cap on a snapshot's or build's memory_mib for this tenant", (v) =>
      parseInt(v, 10),
    )
    .option("--max-vcpus <n>", "cap on a snapshot's or build's vcpus for this tenant", (v) => parseInt(v, 10))
    .option("--max-build-disk-mib <n>", "cap on what one Dockerfile build's layers hold on disk", (v) =>
      parseInt(v, 10),
    )
    .option("--e2b", "an E2B API key (e2b_ + hex, what E2B's SDKs accept as E2B_API_KEY)")
    .option("--json", "JSON output (token and its record)")
    .action(
      async (o: {
        tenant: string;
        admin?: boolean;
        maxSandboxes?: number;
        maxMemoryMib?: number;
        maxVcpus?: number;
        maxBuildDiskMib?: number;
        e2b?: boolean;
        json?: boolean;
      }) => {
        const r = await (
          await ctx.ready()
        ).createToken(
          {
            tenant: o.tenant,
            scope: o.admin ? "admin" : "tenant",
            ...(o.maxSandboxes !== undefined ? { max_sandboxes: o.maxSandboxes } : {}),
            ...(o.maxMemoryMib !== undefined ? { max_memory_mib: o.maxMemoryMib } : {}),
            ...(o.maxVcpus !== undefined ? { max_vcpus: o.maxVcpus } : {}),
            ...(o.maxBuildDiskMib !== undefined ? { max_build_disk_mib: o.maxBuildDiskMib } : {}),
            ...(o.e2b ? { e2b: true } : {}),
          },
          { timeoutMs: CALL_MS },
        );
        if (o.json) console.log(JSON.stringify(r, null, 2));
        else {
          ctx.say(`forkd: token ${r.info.id} for ${r.info.scope} ${r.info.tenant}; it is not shown again`);
          console.log(r.token);
        }
      },
    );

  token
    .command("ls")
    .description("list tokens (never their secrets)")
    .option("--json", "JSON output")
    .action(async (o: { json?: boolean }) => {
      const { tokens } = await (await ctx.ready()).listTokens({ timeoutMs: CALL_MS });
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
      const api = await ctx.ready();
      for (const id of ids) await api.revokeToken(id, { timeoutMs: CALL_MS });
    });
}
