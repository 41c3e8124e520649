/**
 * The processes of one cluster of the scale benchmark (bench/cluster-scale.ts), all under one
 * directory the bench made: etcd members (their own data dirs and loopback ports), the node
 * processes (bench/cluster-node-host.ts, several nodes each) and a gateway (`forkd gateway`,
 * the real process). Each is stopped by its own handle: SIGTERM, then SIGKILL after a bound.
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { closeSync, existsSync, openSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { REPO_DIR } from "../src/host/paths.js";
import { freePort } from "../test/helpers/port.js";
import { request } from "./cluster-http.js";

export interface Proc {
  name: string;
  proc: ChildProcess;
  /** SIGTERM, SIGKILL after `graceMs`; resolves once it exited. */
  stop(graceMs?: number): Promise<void>;
  /** SIGKILL at once (the fault). */
  kill(): Promise<void>;
}

function handle(name: string, proc: ChildProcess): Proc {
  const exited = new Promise<void>((r) => {
    if (proc.exitCode !== null || proc.signalCode !== null) r();
    else proc.once("exit", () => r());
  });
  const alive = () => proc.exitCode === null && proc.signalCode === null;
  return {
    name,
    proc,
    async stop(graceMs = 10_000) {
      if (!alive()) return;
      proc.kill("SIGTERM");
      const t = setTimeout(() => alive() && proc.kill("SIGKILL"), graceMs);
      await exited;
      clearTimeout(t);
    },
    async kill() {
      if (alive()) proc.kill("SIGKILL");
      await exited;
    },
  };
}

const SETPRIV = "/usr/bin/setpriv";

/** FORKD_BENCH_PROF=DIR: node processes write CPU profiles there (--cpu-prof) as they exit. */
const nodeFlags = (): string[] =>
  process.env.FORKD_BENCH_PROF ? ["--cpu-prof", `--cpu-prof-dir=${process.env.FORKD_BENCH_PROF}`] : [];

function spawnLogged(
  name: string,
  cmd: string,
  args: string[],
  log: string,
  o: { env?: NodeJS.ProcessEnv; stdout?: "pipe" } = {},
): Proc {
  if (cmd === process.execPath) args = [...nodeFlags(), ...args];
  // Killed with the bench, should it die before it stops them (setpriv execs: the pid is theirs).
  const [file, ...argv] = existsSync(SETPRIV)
    ? [SETPRIV, "--pdeathsig", "KILL", cmd, ...args]
    : [cmd, ...args];
  const fd = openSync(log, "a");
  try {
    const proc = spawn(file ?? cmd, argv, {
      stdio: ["pipe", o.stdout === "pipe" ? "pipe" : fd, fd],
      env: o.env ?? process.env,
    });
    proc.on("error", () => undefined);
    proc.stdin?.on("error", () => undefined);
    return handle(name, proc);
  } finally {
    closeSync(fd);
  }
}

async function until(what: string, boundMs: number, ok: () => Promise<boolean>, dead: () => boolean) {
  const deadline = Date.now() + boundMs;
  for (;;) {
    if (await ok().catch(() => false)) return;
    if (dead()) throw new Error(`${what} exited while starting`);
    if (Date.now() > deadline) throw new Error(`${what} did not come up within ${boundMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export interface Etcd {
  /** Client URLs (http://127.0.0.1:P), one per member. */
  urls: string[];
  members: Proc[];
}

/** `members` etcd members on loopback (a static cluster), data under <dir>/etcd-<i>. */
export async function startEtcd(dir: string, members: number): Promise<Etcd> {
  const ports = [];
  for (let i = 0; i < members; i++) ports.push({ client: await freePort(), peer: await freePort() });
  const initial = ports.map((p, i) => `e${i}=http://127.0.0.1:${p.peer}`).join(",");
  const procs = ports.map((p, i) =>
    spawnLogged(
      `etcd e${i}`,
      "/usr/bin/etcd",
      [
        `--name=e${i}`,
        `--data-dir=${join(dir, `etcd-${i}`)}`,
        `--listen-client-urls=http://127.0.0.1:${p.client}`,
        `--advertise-client-urls=http://127.0.0.1:${p.client}`,
        `--listen-peer-urls=http://127.0.0.1:${p.peer}`,
        `--initial-advertise-peer-urls=http://127.0.0.1:${p.peer}`,
        `--initial-cluster=${initial}`,
        "--initial-cluster-token=forkd-bench",
        // As `forkd cluster up` runs them (docs/cluster.md).
        "--heartbeat-interval=50",
        "--election-timeout=500",
        "--logger=zap",
        "--log-outputs=stderr",
      ],
      join(dir, `etcd-${i}.log`),
    ),
  );
  const urls = ports.map((p) => `http://127.0.0.1:${p.client}`);
  for (const [i, url] of urls.entries())
    await until(
      `etcd e${i}`,
      30_000,
      async () => (await request(url, "GET", "/health")).status === 200,
      () => procs[i]?.proc.exitCode !== null,
    );
  return { urls, members: procs };
}

export interface NodeHost {
  proc: Proc;
  nodes: { id: string; api: string }[];
}

/** One process of `ids` nodes (bench/cluster-node-host.ts); resolves once all serve. */
export async function startNodeHost(
  dir: string,
  spec: {
    cluster: string;
    prefix: string;
    adminToken: string;
    maxSandboxes: number;
    ids: string[];
    env: Record<string, string>;
  },
): Promise<NodeHost> {
  const p = spawnLogged(
    `nodes ${spec.ids[0]}..`,
    process.execPath,
    [join(REPO_DIR, "dist/bench/cluster-node-host.js"), JSON.stringify({ ...spec, dir })],
    join(dir, `host-${spec.ids[0]}.out`),
    // Each daemon has libuv's 4 file threads of its own: so do the nodes sharing a process.
    {
      stdout: "pipe",
      env: { ...process.env, UV_THREADPOOL_SIZE: String(Math.min(1024, 4 * spec.ids.length)) },
    },
  );
  const out = p.proc.stdout;
  if (!out) throw new Error("no stdout");
  const line = await new Promise<string>((resolve, reject) => {
    const rl = createInterface({ input: out });
    const t = setTimeout(() => reject(new Error(`${p.name} did not start within 300 s`)), 300_000);
    rl.once("line", (l) => {
      clearTimeout(t);
      resolve(l);
    });
    p.proc.once("exit", (c) => reject(new Error(`${p.name} exited (${String(c)}) while starting`)));
  });
  const v = JSON.parse(line) as { ready?: { id: string; api: string }[]; error?: string };
  if (!v.ready) {
    await p.kill();
    throw new Error(`${p.name} failed: ${v.error ?? line}`);
  }
  return { proc: p, nodes: v.ready };
}

export interface GatewayProc {
  proc: Proc;
  url: string;
}

/** `forkd gateway` (dist/src/cli/main.js) on a loopback port, until its health answers. */
export async function startGatewayProc(
  dir: string,
  name: string,
  o: { cluster: string; prefix: string; secretFile: string; adminToken: string },
): Promise<GatewayProc> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const p = spawnLogged(
    name,
    process.execPath,
    [join(REPO_DIR, "dist/src/cli/main.js"), "gateway"],
    join(dir, `${name}.log`),
    {
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        HOME: process.env.HOME ?? "/root",
        FORKD_CLUSTER: o.cluster,
        FORKD_CLUSTER_PREFIX: o.prefix,
        FORKD_CLUSTER_SECRET_FILE: o.secretFile,
        FORKD_GATEWAY_LISTEN: `127.0.0.1:${port}`,
        FORKD_TOKEN: o.adminToken,
        FORKD_DATA_DIR: join(dir, name),
      },
    },
  );
  await until(
    name,
    60_000,
    async () => (await request(url, "GET", "/v1/health", { token: o.adminToken })).status === 200,
    () => p.proc.exitCode !== null,
  );
  return { proc: p, url };
}
