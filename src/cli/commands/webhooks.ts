/**
 * `forkd webhook create|ls|show|rm`: lifecycle webhooks (docs/webhooks.md). A tenant's token
 * manages its own (told of its own sandboxes); an admin's are operator-wide.
 */
import type { Command } from "commander";
import type { CliContext } from "../context.js";
import { printTable } from "../table.js";
import { CALL_MS } from "../timeouts.js";

const EVENTS = "created,paused,resumed,killed,exited,branched";

export function webhookCommands(program: Command, ctx: CliContext): void {
  const webhook = program
    .command("webhook")
    .description("lifecycle webhooks: a URL told of sandboxes' events, signed (docs/webhooks.md)");

  webhook
    .command("create")
    .description("register a webhook; prints its secret (shown only this once) on stdout")
    .argument("<url>", "http(s) URL each event is POSTed to")
    .option("--events <list>", `comma-separated events (default: all of ${EVENTS})`)
    .option("--name <name>", "a name to know it by")
    .option("--secret <secret>", "the signing secret (16-256 characters; default: a new one)")
    .option("--disabled", "registered, but sent nothing until re-created enabled")
    .option("--json", "JSON output (the webhook and its secret)")
    .action(
      async (
        url: string,
        o: { events?: string; name?: string; secret?: string; disabled?: boolean; json?: boolean },
      ) => {
        const events = o.events
          ?.split(",")
          .map((e) => e.trim())
          .filter((e) => e !== "");
        const r = await (
          await ctx.ready()
        ).createWebhook(
          {
            url,
            ...(events ? { events } : {}),
            ...(o.name !== undefined ? { name: o.name } : {}),
            ...(o.secret !== undefined ? { secret: o.secret } : {}),
            ...(o.disabled ? { enabled: false } : {}),
          },
          { timeoutMs: CALL_MS },
        );
        if (o.json) console.log(JSON.stringify(r, null, 2));
        else {
          ctx.say(`forkd: webhook ${r.id} (${r.events.join(",")}); its secret is not shown again`);
          console.log(r.secret);
        }
      },
    );

  webhook
    .command("ls")
    .description("list webhooks and their delivery state (never their secrets)")
    .option("--json", "JSON output")
    .action(async (o: { json?: boolean }) => {
      const { webhooks } = await (await ctx.ready()).listWebhooks({ timeoutMs: CALL_MS });
      if (o.json) console.log(JSON.stringify(webhooks, null, 2));
      else
        printTable(
          ["ID", "NAME", "URL", "TENANT", "EVENTS", "QUEUED", "DELIVERED", "LAST ERROR"],
          webhooks.map((w) => [
            w.id,
            w.name || "-",
            w.url,
            w.tenant ?? "(all)",
            w.events.length === 6 ? "all" : w.events.join(","),
            String(w.state.queued),
            String(w.state.delivered),
            w.state.last_error ?? "-",
          ]),
        );
    });

  webhook
    .command("show")
    .description("one webhook and its delivery state, as JSON")
    .argument("<id>")
    .action(async (id: string) => {
      console.log(JSON.stringify(await (await ctx.ready()).getWebhook(id, { timeoutMs: CALL_MS }), null, 2));
    });

  webhook
    .command("rm")
    .description("delete webhooks: nothing more is sent, undelivered events are dropped")
    .argument("<ids...>")
    .action(async (ids: string[]) => {
      const api = await ctx.ready();
      for (const id of ids) await api.deleteWebhook(id, { timeoutMs: CALL_MS });
    });
}
