/** Files in a sandbox: cp (both ways, streamed), and `files` ls, stat, rm, mkdir, mv. */
import { createReadStream, createWriteStream } from "node:fs";
import { pipeline } from "node:stream/promises";
import type { Command } from "commander";
import type { CliContext } from "../context.js";
import { usageError } from "../errors.js";
import { interruptible } from "../interrupt.js";
import { printTable } from "../table.js";
import { CALL_MS, TRANSFER_IDLE_MS } from "../timeouts.js";

/** "sb-…:/abs/path" → [id, path]. */
function remotePath(s: string): [string, string] | null {
  const m = /^(sb-[a-z2-7]{16}):(\/.*)$/.exec(s);
  return m ? [m[1]!, m[2]!] : null;
}

export function fileCommands(program: Command, ctx: CliContext): void {
  program
    .command("cp")
    .description("copy a file into (LOCAL ID:PATH) or out of (ID:PATH LOCAL) a sandbox; - is stdin/stdout")
    .argument("<src>")
    .argument("<dst>")
    .action(async (src: string, dst: string) => {
      const from = remotePath(src);
      const to = remotePath(dst);
      if ((from === null) === (to === null))
        throw usageError("exactly one of SRC and DST must be ID:/absolute/path");
      const api = await ctx.ready();
      await interruptible("nothing more is copied", async (signal) => {
        const o = { timeoutMs: TRANSFER_IDLE_MS, signal };
        if (from) {
          const res = await api.readFile(from[0], from[1], o);
          await pipeline(res, dst === "-" ? process.stdout : createWriteStream(dst), { signal });
        } else if (to) {
          await api.writeFile(
            to[0],
            to[1],
            src === "-" ? process.stdin : createReadStream(src),
            { parents: true },
            o,
          );
        }
      });
    });

  const files = program.command("files").description("a sandbox's files: ls, stat, rm, mkdir, mv");
  const at = (s: string): [string, string] => {
    const r = remotePath(s);
    if (!r) throw usageError(`not ID:/absolute/path: ${s}`);
    return r;
  };

  files
    .command("ls")
    .description("list a directory")
    .argument("<id:path>")
    .option("--json", "JSON output")
    .action(async (where: string, o: { json?: boolean }) => {
      const [id, path] = at(where);
      const r = await (await ctx.ready()).listDir(id, path, { timeoutMs: CALL_MS });
      if (o.json) return console.log(JSON.stringify(r, null, 2));
      printTable(
        ["TYPE", "MODE", "SIZE", "MODIFIED", "NAME"],
        r.entries.map((e) => [
          e.type,
          (e.mode & 0o7777).toString(8).padStart(4, "0"),
          String(e.size),
          new Date(e.mtime_ms).toISOString(),
          e.name,
        ]),
      );
    });

  files
    .command("stat")
    .description("a file's type, size, mode and time, as JSON")
    .argument("<id:path>")
    .action(async (where: string) => {
      const [id, path] = at(where);
      console.log(
        JSON.stringify(await (await ctx.ready()).statFile(id, path, { timeoutMs: CALL_MS }), null, 2),
      );
    });

  files
    .command("rm")
    .description("remove a file (a directory with -r)")
    .argument("<id:path>")
    .option("-r, --recursive", "a directory and everything in it")
    .action(async (where: string, o: { recursive?: boolean }) => {
      const [id, path] = at(where);
      await (
        await ctx.ready()
      ).removeFile(id, path, { recursive: o.recursive ?? false }, { timeoutMs: CALL_MS });
    });

  files
    .command("mkdir")
    .description("make a directory")
    .argument("<id:path>")
    .option("-p, --parents", "and its parents")
    .action(async (where: string, o: { parents?: boolean }) => {
      const [id, path] = at(where);
      await (await ctx.ready()).mkdir(id, { path, parents: o.parents ?? false }, { timeoutMs: CALL_MS });
    });

  files
    .command("mv")
    .description("rename a file or directory within a sandbox")
    .argument("<id:from>")
    .argument("<to>", "the new absolute path")
    .action(async (where: string, to: string) => {
      const [id, from] = at(where);
      await (await ctx.ready()).rename(id, { from, to }, { timeoutMs: CALL_MS });
    });
}
