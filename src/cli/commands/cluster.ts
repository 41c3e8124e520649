/**
 * `forkd cluster up|down|status`: a real cluster on this machine (src/localcluster): etcd
 * members, N forkd nodes each in a network namespace of its own, and gateways. `up` prints the
 * gateway URL(s), the admin token and the exports that point forkd's CLI and SDKs and E2B's SDKs
 * at it (`--json` for scripts); `down` removes every process, namespace and file it made.
 */
import type { Command } from "commander";
import { InvalidArgumentError } from "commander";
import { ForkdError } from "@forkd/sdk";
import { down, exportLines, inheritedSettings, status, up } from "../../localcluster/index.js";
import type { CliContext } from "../context.js";

const DEFAULT_DIR = "/var/lib/forkd-cluster";

/**
 * localcluster's failures carry forkd's error codes: as the SDK's errors, they end the CLI with
 * the codes' exit statuses (2 invalid_argument, 3 not_found).
 */
async function coded<T>(p: Promise<T>): Promise<T> {
  return p.catch((e: unknown) => {
    const code = (e as { code?: unknown }).code;
    if (
      e instanceof Error &&
      !(e instanceof ForkdError) &&
      typeof code === "string" &&
      /^[a-z_]+$/.test(code)
    )
      throw new ForkdError(e.message, { code });
    throw e;
  });
}

const count = (min: number) => (v: string) => {
  const n = Number(v);
  if (!/^\d+$/.test(v) || n < min) throw new InvalidArgumentError(`an integer >= ${min}`);
  return n;
};

export function clusterCommands(program: Command, ctx: CliContext): void {
  const cluster = program
    .command("cluster")
    .description("a local cluster on this machine: etcd, forkd nodes in network namespaces, gateways (root)");

  cluster
    .command("up")
    .description("start a local cluster; prints its gateway URL, admin token and client exports")
    .requiredOption("--nodes <n>", "forkd nodes", count(1))
    .option("--gateways <n>", "gateways (0: none; clients then reach node n1)", count(0), 1)
    .option("--etcd <n>", "etcd members", count(1), 3)
    .option("--dir <dir>", "the cluster's directory (state, logs, data)", DEFAULT_DIR)
    .option("--subnet <k>", "use 10.240.K.0/24 (default: a free one)", count(1))
    .option("--keep-on-failure", "leave a cluster that failed to start for `down` (and its logs)")
    .option("--json", "machine-readable output")
    .action(
      async (o: {
        nodes: number;
        gateways: number;
        etcd: number;
        dir: string;
        subnet?: number;
        keepOnFailure?: boolean;
        json?: boolean;
      }) => {
        const info = await coded(
          up({
            nodes: o.nodes,
            gateways: o.gateways,
            etcdMembers: o.etcd,
            dir: o.dir,
            ...(o.subnet !== undefined ? { subnet: o.subnet } : {}),
            settings: inheritedSettings(ctx.env),
            from: ctx.env,
            keepOnFailure: o.keepOnFailure ?? false,
            say: (l) => ctx.say(`forkd: ${l}`),
          }),
        );
        if (o.json) return console.log(JSON.stringify(info, null, 2));
        for (const g of info.gateways) ctx.say(`gateway ${g.name}: ${g.url} (E2B: ${g.e2bUrl})`);
        if (info.gateways.length === 0) ctx.say("no gateway: the exports point at node n1");
        for (const n of info.nodes) ctx.say(`node ${n.id}: ${n.url} (netns ${n.netns})`);
        ctx.say(`admin token: ${info.token}`);
        ctx.say(
          `eval "$(forkd cluster status --dir ${info.dir} --env)" sets these again; down: forkd cluster down --dir ${info.dir}`,
        );
        for (const l of exportLines(info.env)) console.log(l);
      },
    );

  cluster
    .command("down")
    .description("stop a local cluster and remove every process, namespace and file it made")
    .option("--dir <dir>", "the cluster's directory", DEFAULT_DIR)
    .action(async (o: { dir: string }) => {
      const r = await coded(down(o.dir, { say: (l) => ctx.say(`forkd: ${l}`) }));
      if (!r.found) ctx.say(`forkd: no cluster in ${o.dir}`);
    });

  cluster
    .command("status")
    .description("each process of a local cluster: running, serving")
    .option("--dir <dir>", "the cluster's directory", DEFAULT_DIR)
    .option("--json", "machine-readable output")
    .option("--env", "print only the client exports (for eval)")
    .action(async (o: { dir: string; json?: boolean; env?: boolean }) => {
      const s = await coded(status(o.dir));
      if (o.json) return console.log(JSON.stringify(s, null, 2));
      if (o.env) return console.log(exportLines(s.env).join("\n"));
      console.log(`cluster ${s.id} (${s.phase}) on ${s.subnet}, in ${s.dir}`);
      for (const p of s.processes)
        console.log(
          `${p.role.padEnd(8)} ${p.name.padEnd(4)} pid ${String(p.pid ?? "-").padEnd(8)} ` +
            `${p.problem === null ? "serving" : p.problem}`,
        );
      if (s.processes.some((p) => p.problem !== null)) process.exitCode = 1;
    });
}
