/** Snapshots: snapshot (create, or a layer --from), images, image, rmi, compact. */
import { Option } from "commander";
import type { Command } from "commander";
import type { Wire } from "@forkd/sdk";
import type { CliContext } from "../context.js";
import { usageError } from "../errors.js";
import { interruptible } from "../interrupt.js";
import { snapshotLayer } from "../layer.js";
import { snapshotFromDockerfile, warmEvalLanguage } from "../dockerfile.js";
import { ProgressView } from "../progress.js";
import { printTable } from "../table.js";
import { CALL_MS, HEAVY_MS, PROGRESS_IDLE_MS } from "../timeouts.js";

export function snapshotCommands(program: Command, ctx: CliContext): void {
  program
    .command("snapshot")
    .description("boot a parent VM, warm it, and freeze it into a snapshot")
    .requiredOption("--tag <tag>", "snapshot tag")
    .option("--template <name>", "guest template (default python, unless --image)")
    .option("--image <ref>", "an OCI/Docker image to boot instead of a template (e.g. python:3.11)")
    .option("--start-cmd <cmd>", "shell command started in the background before freezing (a server)")
    .option("--ready-cmd <cmd>", "shell command polled until it exits 0 before freezing")
    .option("--ready-timeout <s>", "seconds --ready-cmd has to succeed (default 120)", (v) => parseFloat(v))
    .option("--warm <cmd>", "shell command to run in the parent before freezing")
    .option(
      "--warm-eval <code>",
      "code to run in the parent's warm kernel before freezing (Python by default)",
    )
    .addOption(
      new Option(
        "--warm-eval-language <lang>",
        "the kernel --warm-eval runs in (javascript needs node in the image)",
      ).choices(["python", "javascript"]),
    )
    .option("--memory <MiB>", "guest RAM in MiB", (v) => parseInt(v, 10), 512)
    .option("--vcpus <n>", "vCPUs", (v) => parseInt(v, 10), 1)
    .option("--dockerfile <path>", "build the image from this Dockerfile (its folder is the build context)")
    .option(
      "--build-arg <name=value>",
      "with --dockerfile: a build argument (repeatable)",
      (v: string, prev: string[] = []) => [...prev, v],
    )
    .option("--from <tag>", "build a layer on an existing snapshot: fork it, run --exec, branch, kill")
    .option("--exec <cmd>", "with --from: shell command that makes the layer")
    .option("--json", "print the snapshot metadata as JSON")
    .action(
      async (o: {
        tag: string;
        template?: string;
        image?: string;
        startCmd?: string;
        readyCmd?: string;
        readyTimeout?: number;
        warm?: string;
        warmEval?: string;
        warmEvalLanguage?: "python" | "javascript";
        memory: number;
        vcpus: number;
        from?: string;
        exec?: string;
        json?: boolean;
        dockerfile?: string;
        buildArg?: string[];
      }) => {
        if (o.warmEvalLanguage !== undefined && o.warmEval === undefined)
          throw usageError("--warm-eval-language goes with --warm-eval");
        if (o.dockerfile !== undefined) {
          if (o.from !== undefined) throw usageError("--dockerfile and --from do not go together");
          const api = await ctx.ready();
          const m = await snapshotFromDockerfile(api, { ...o, dockerfile: o.dockerfile }, ctx);
          if (o.json) console.log(JSON.stringify(m, null, 2));
          else console.log(`snapshot ${m.tag} ready (built from ${o.dockerfile})`);
          return;
        }
        if (o.buildArg !== undefined) throw usageError("--build-arg goes with --dockerfile");
        if (o.from !== undefined || o.exec !== undefined) {
          if (o.from === undefined || o.exec === undefined) throw usageError("--from and --exec go together");
          const api = await ctx.ready();
          process.exitCode = await snapshotLayer(
            api,
            { from: o.from, tag: o.tag, exec: o.exec, json: o.json ?? false },
            ctx.say,
            ctx.progressOut,
          );
          return;
        }
        if (o.image !== undefined && o.template !== undefined)
          throw usageError("--image and --template exclude each other");
        if (o.readyTimeout !== undefined && !(o.readyTimeout >= 1 && o.readyTimeout <= 3600))
          throw usageError("--ready-timeout: seconds between 1 and 3600");
        const source = o.image !== undefined ? `image ${o.image}` : `template ${o.template ?? "python"}`;
        ctx.say(`forkd: creating snapshot ${o.tag} (${source}); the first run builds the guest image`);
        const t0 = Date.now();
        const api = await ctx.ready();
        const view = new ProgressView(ctx.progressOut);
        let m: Wire["Snapshot"];
        try {
          m = await interruptible("the snapshot goes on in the daemon (forkd images shows it)", (signal) =>
            api.createSnapshot(
              {
                tag: o.tag,
                ...(o.image !== undefined ? { image: o.image } : { template: o.template ?? "python" }),
                ...(o.startCmd !== undefined ? { start_cmd: o.startCmd } : {}),
                ...(o.readyCmd !== undefined ? { ready_cmd: o.readyCmd } : {}),
                ...(o.readyTimeout !== undefined
                  ? { ready_timeout_ms: Math.round(o.readyTimeout * 1000) }
                  : {}),
                ...(o.warm !== undefined ? { warm: o.warm } : {}),
                ...(o.warmEval !== undefined ? { warm_eval: o.warmEval } : {}),
                ...warmEvalLanguage(o.warmEvalLanguage),
                memory_mib: o.memory,
                vcpus: o.vcpus,
              },
              { timeoutMs: PROGRESS_IDLE_MS, signal, onProgress: (ev) => view.event(ev) },
            ),
          );
        } finally {
          view.end();
        }
        if (o.json) console.log(JSON.stringify(m, null, 2));
        else
          console.log(
            `snapshot ${m.tag} ready: boot ${Math.round(m.timings.boot_ms)} ms, freeze ${Math.round(m.timings.freeze_ms)} ms, total ${Date.now() - t0} ms`,
          );
      },
    );

  program
    .command("images")
    .description("list snapshots")
    .option("--json", "JSON output")
    .action(async (o: { json?: boolean }) => {
      const r = await (await ctx.ready()).listSnapshots({ timeoutMs: CALL_MS });
      if (o.json) console.log(JSON.stringify(r, null, 2));
      else
        printTable(
          ["TAG", "STATUS", "PARENT", "SOURCE", "MEMORY", "VCPUS", "ACCEL", "CREATED"],
          [
            ...r.snapshots.map((s) => [
              s.tag,
              "ready",
              s.parent?.tag ?? "-",
              sourceText(s.source),
              `${s.machine.memory_mib}M`,
              String(s.machine.vcpus),
              s.machine.accel,
              s.created,
            ]),
            ...r.pending.map((p) => [p.tag, p.status, "-", "-", "-", "-", "-", p.started]),
          ],
        );
    });

  program
    .command("image")
    .description("print a snapshot's metadata (or, being written or failed, its status) as JSON")
    .argument("<tag>")
    .option("--info", "its chain, dependents and sizes on disk instead")
    .action(async (tag: string, o: { info?: boolean }) => {
      const api = await ctx.ready();
      const r = o.info
        ? await api.snapshotInfo(tag, { timeoutMs: CALL_MS })
        : await api.getSnapshot(tag, { timeoutMs: CALL_MS });
      console.log(JSON.stringify(r, null, 2));
    });

  program
    .command("rmi")
    .description("delete snapshots (refused while sandboxes run from one, or branches stack on it)")
    .argument("<tags...>")
    .option("--cascade", "delete the branches stacked on it too (deepest first)")
    .option("--force", "flatten the branches stacked on it, so they no longer need it, then delete it")
    .action(async (tags: string[], o: { cascade?: boolean; force?: boolean }) => {
      if (o.cascade && o.force) throw usageError("--cascade and --force exclude each other");
      const api = await ctx.ready();
      for (const t of tags) {
        const r = await api.deleteSnapshot(
          t,
          { cascade: o.cascade ?? false, force: o.force ?? false },
          // Flattening dependents copies their disks.
          { timeoutMs: o.force ? HEAVY_MS : CALL_MS },
        );
        const also = [
          ...(r.cascaded?.length ? [`with ${r.cascaded.join(", ")}`] : []),
          ...(r.orphaned?.length ? [`${r.orphaned.join(", ")} flattened`] : []),
        ];
        if (also.length > 0) ctx.say(`forkd: deleted ${r.deleted} (${also.join("; ")})`);
      }
    });

  program
    .command("compact")
    .description("copy a snapshot as a new base with no parent (its disk chain in one layer)")
    .argument("<tag>")
    .requiredOption("--tag <new>", "tag of the copy")
    .option("--json", "print its metadata as JSON")
    .action(async (tag: string, o: { tag: string; json?: boolean }) => {
      const m = await (await ctx.ready()).compactSnapshot(tag, { tag: o.tag }, { timeoutMs: HEAVY_MS });
      if (o.json) console.log(JSON.stringify(m, null, 2));
      else console.log(`${m.tag} ready (a base copy of ${tag})`);
    });
}

/** A snapshot's source in one column: `template python`, `image REF@DIGEST`, `dockerfile`. */
export function sourceText(src: Wire["Snapshot"]["source"]): string {
  if (src.kind === "template") return `template ${src.name}`;
  if (src.kind === "image") return `image ${src.ref}@${src.digest.replace(/^sha256:/, "").slice(0, 12)}`;
  return src.kind;
}
