/**
 * Moving snapshots between hosts: pack (download a pack file), unpack (upload one), push and
 * pull (the daemon talks to the registry or URL and streams its progress). Byte counts of a
 * pack's download or upload are the CLI's own; the daemon's progress events say the rest.
 */
import { createReadStream, createWriteStream } from "node:fs";
import { rename, rm, stat } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import type { Command } from "commander";
import type { CliContext } from "../context.js";
import { interruptible } from "../interrupt.js";
import { byteMeter } from "../meter.js";
import { ProgressView, mib } from "../progress.js";
import { PROGRESS_IDLE_MS, TRANSFER_IDLE_MS } from "../timeouts.js";

const GOES_ON = "the transfer goes on in the daemon (its log says how it ended)";

export function transferCommands(program: Command, ctx: CliContext): void {
  program
    .command("pack")
    .description(
      "write a snapshot (its chain, disk layers and guest image) to a file that restores on another host",
    )
    .argument("<tag>")
    .requiredOption("-o, --output <file>", "the pack file to write")
    .action(async (tag: string, o: { output: string }) => {
      const api = await ctx.ready();
      const tmp = `${o.output}.partial-${process.pid}`;
      const view = new ProgressView(ctx.progressOut);
      try {
        await interruptible("nothing is written", async (signal) => {
          view.local({ phase: "stage", message: `the daemon gathers ${tag}'s chain, layers and image` });
          const res = await api.pack(tag, { timeoutMs: TRANSFER_IDLE_MS, signal });
          const meter = byteMeter((n) => view.local({ phase: "download", done_bytes: n, message: o.output }));
          await pipeline(res, meter, createWriteStream(tmp, { flags: "wx" }), { signal });
        });
        await rename(tmp, o.output);
      } catch (e) {
        await rm(tmp, { force: true });
        throw e;
      } finally {
        view.end();
      }
      ctx.say(`forkd: wrote ${o.output} (${((await stat(o.output)).size / 2 ** 20).toFixed(1)} MiB)`);
    });

  program
    .command("unpack")
    .description("register the snapshot in a pack file (verified first; all or nothing)")
    .argument("<file>")
    .action(async (file: string) => {
      const { size } = await stat(file); // a missing file is the user's error, before any request
      const api = await ctx.ready();
      const view = new ProgressView(ctx.progressOut);
      let r;
      try {
        r = await interruptible("nothing is registered", (signal) => {
          const meter = byteMeter((n) => {
            if (n < size) view.local({ phase: "upload", done_bytes: n, total_bytes: size, message: file });
            else
              view.local({
                phase: "verify",
                message: "the daemon checks every file, then registers the chain",
              });
          });
          createReadStream(file)
            .once("error", (e) => meter.destroy(e))
            .pipe(meter);
          return api.unpack(meter, { timeoutMs: TRANSFER_IDLE_MS, signal });
        });
      } finally {
        view.end();
      }
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
      const api = await ctx.ready();
      const view = new ProgressView(ctx.progressOut);
      let r;
      try {
        r = await interruptible(GOES_ON, (signal) =>
          api.push(
            tag,
            { ref, insecure: o.insecure ?? false },
            { timeoutMs: PROGRESS_IDLE_MS, signal, onProgress: (ev) => view.event(ev) },
          ),
        );
      } finally {
        view.end();
      }
      if (o.json) return console.log(JSON.stringify(r, null, 2));
      console.log(
        `${r.ref}@${r.digest}: ${r.blobs.uploaded} of ${r.blobs.total} blobs uploaded (${mib(r.bytes.uploaded)}), ` +
          `${r.blobs.skipped} already there, ${r.blobs.mounted} mounted`,
      );
    });

  program
    .command("pull")
    .description(
      "register a snapshot from an OCI registry, from a pack file at an https URL, or from a peer node of the " +
        "cluster (--peer: only what this node lacks, under the same keys) (verified first; all or nothing)",
    )
    .argument("<source>", "HOST[:PORT]/NAME[:TAG|@DIGEST], https://…/FILE.tar.zst, or with --peer the key")
    .option("--tag <tag>", "register the snapshot under this tag (its ancestors keep theirs)")
    .option(
      "--peer <url>",
      "pull the key <source> from this peer node (its FORKD_NODE_ADDR; admins only); repeated: holders, best first",
      (url: string, prev: string[] | undefined) => [...(prev ?? []), url],
    )
    .option("--insecure", "allow plain http to a host that is not on loopback")
    .option("--json", "print the result as JSON")
    .action(
      async (source: string, o: { tag?: string; peer?: string[]; insecure?: boolean; json?: boolean }) => {
        const api = await ctx.ready();
        const isUrl = /^[a-z][a-z0-9+.-]*:\/\//i.test(source);
        if (o.peer !== undefined && o.tag !== undefined)
          throw new Error("--peer keeps the key it pulls: no --tag with it");
        const from =
          o.peer !== undefined
            ? { peer: o.peer, tag: source }
            : {
                ...(isUrl ? { url: source } : { ref: source }),
                ...(o.tag !== undefined ? { tag: o.tag } : {}),
              };
        const view = new ProgressView(ctx.progressOut);
        let r;
        try {
          r = await interruptible(GOES_ON, (signal) =>
            api.pull(
              { ...from, insecure: o.insecure ?? false },
              { timeoutMs: PROGRESS_IDLE_MS, signal, onProgress: (ev) => view.event(ev) },
            ),
          );
        } finally {
          view.end();
        }
        if (o.json) return console.log(JSON.stringify(r, null, 2));
        console.log(
          `${r.tag} ready (registered: ${r.published.join(", ") || "nothing new"}; ` +
            `${r.blobs.downloaded} downloaded (${mib(r.bytes.downloaded)}), ${r.blobs.reused} here already)`,
        );
      },
    );
}
