/**
 * The daemon: the single owner of snapshots and sandboxes. Builds every service, recovers state
 * left by an earlier daemon (re-adopting running children), and serves the API on a unix socket
 * (mode 0600) and, only with a bearer token, on TCP.
 */
import { chmod, mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Server } from "node:http";
import { createAdaptorServer } from "@hono/node-server";
import { createApp } from "../api/app.js";
import type { Services } from "../api/services.js";
import { chooseAccel } from "../host/accel.js";
import { defaultPaths, sandboxesDir, snapshotsDir } from "../host/paths.js";
import type { Paths } from "../host/paths.js";
import { findQemu, qemuVersion } from "../host/qemu-binary.js";
import { ImageBuilder } from "../image/builder.js";
import { SandboxService } from "../sandbox/service.js";
import { SnapshotStore } from "../snapshot/store.js";
import { ForkdError } from "../util/errors.js";
import { jsonLogger } from "../util/log.js";
import { QemuDriver } from "../vmm/qemu.js";
import { findJailer, findMemsnap } from "../host/native.js";
import { NetworkService } from "../net/service.js";
import { VERSION } from "../version.js";
import { acquireDaemonLock } from "./lock.js";

export interface DaemonOptions {
  paths?: Paths;
  env?: NodeJS.ProcessEnv;
}

export interface Daemon {
  services: Services;
  close(opts?: { killSandboxes?: boolean }): Promise<void>;
}

const MIN_TOKEN = 32;

export async function startDaemon(opts: DaemonOptions = {}): Promise<Daemon> {
  const env = opts.env ?? process.env;
  const paths = opts.paths ?? defaultPaths(env);
  const log = jsonLogger("daemon");
  await mkdir(paths.dataDir, { recursive: true, mode: 0o700 });
  const runDir = join(paths.dataDir, "run");
  for (const d of [snapshotsDir(paths), sandboxesDir(paths), runDir])
    await mkdir(d, { recursive: true, mode: 0o700 });

  const releaseLock = await acquireDaemonLock(paths.dataDir);
  // We own the data directory now: a socket file left here belongs to a dead daemon.
  await rm(paths.socket, { force: true });
  await rm(runDir, { recursive: true, force: true });
  await mkdir(runDir, { recursive: true, mode: 0o700 });

  const accel = await chooseAccel(await findQemu(env), env);
  const qemu = await findQemu(env, accel.accel);
  const qemuVer = await qemuVersion(qemu);
  if (accel.accel === "tcg" && !accel.forced) {
    log.warn(`no usable KVM: running guests under TCG software emulation (slow). Reason: ${accel.reason}`);
  }
  const jailer = await findJailer(env);
  const driver = new QemuDriver(qemu, { jailer });
  const store = new SnapshotStore(snapshotsDir(paths));
  const network = await NetworkService.start({
    dataDir: paths.dataDir,
    env,
    log,
    qemuBinary: qemu,
    jailer,
    protectedPorts: listenPort(env.FORKD_LISTEN),
  });
  const sandboxes = new SandboxService({
    root: sandboxesDir(paths),
    store,
    driver,
    log,
    tbSizeMiB: Number(env.FORKD_TB_SIZE_MIB ?? 32),
    poolSize: Number(env.FORKD_POOL_SIZE ?? 2),
    forkParallelism: Number(env.FORKD_FORK_PARALLELISM ?? 0) || undefined,
    maxSandboxes: Number(env.FORKD_MAX_SANDBOXES ?? 1000),
    memsnap: await findMemsnap(env),
    network,
  });
  const cleaned = await store.recover();
  const { adopted, removed } = await sandboxes.recover();
  // After re-adopting children: their slots keep their rules, every other one is reclaimed.
  await network.reclaim();
  log.info("state recovered", {
    adopted: adopted.length,
    removed: removed.length,
    staging_cleaned: cleaned.length,
  });

  const token = env.FORKD_TOKEN;
  const services: Services = {
    store,
    sandboxes,
    log,
    snapshotDeps: {
      store,
      driver,
      images: new ImageBuilder(paths.repoDir, paths.cacheDir),
      accel,
      qemuVersion: qemuVer,
      runDir,
    },
    info: {
      version: VERSION,
      accel,
      qemu: { binary: qemu, version: qemuVer },
      startedAt: new Date().toISOString(),
      cacheDir: paths.cacheDir,
    },
  };
  const servers: Server[] = [];
  const unix = createAdaptorServer({ fetch: createApp(services).fetch }) as Server;
  unix.requestTimeout = 0;
  // The socket must never exist with looser permissions, not even between bind and chmod.
  const oldUmask = process.umask(0o077);
  try {
    await listen(unix, paths.socket);
  } finally {
    process.umask(oldUmask);
  }
  await chmod(paths.socket, 0o600);
  servers.push(unix);

  const tcp = env.FORKD_LISTEN;
  if (tcp) {
    if (!token || token.length < MIN_TOKEN || /^(changeme|token|secret|x+)$/i.test(token)) {
      throw new ForkdError(
        "invalid_argument",
        `FORKD_LISTEN needs FORKD_TOKEN of at least ${MIN_TOKEN} random characters`,
      );
    }
    const m = /^(.*):(\d+)$/.exec(tcp);
    if (!m) throw new ForkdError("invalid_argument", "FORKD_LISTEN must be HOST:PORT");
    const server = createAdaptorServer({ fetch: createApp({ ...services, token }).fetch }) as Server;
    server.requestTimeout = 0;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(Number(m[2]), m[1], () => resolve());
    });
    servers.push(server);
  }
  log.info("forkd daemon listening", {
    socket: paths.socket,
    tcp: tcp ?? null,
    accel: accel.accel,
    qemu: qemuVer,
  });

  let closed = false;
  return {
    services,
    async close(o = {}) {
      if (closed) return;
      closed = true;
      // Stop accepting; give in-flight requests a moment, then cut streams that would hold us.
      const closing = Promise.all(servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
      const cut = setTimeout(() => servers.forEach((s) => s.closeAllConnections()), 2_000);
      await closing;
      clearTimeout(cut);
      if (o.killSandboxes) await sandboxes.killAll();
      else await sandboxes.detachAll();
      await network.close();
      await rm(paths.socket, { force: true });
      await releaseLock();
    },
  };
}

/** The TCP port of FORKD_LISTEN (HOST:PORT), which no sandbox may reach. */
function listenPort(v: string | undefined): number[] {
  const port = Number(/:(\d+)$/.exec(v ?? "")?.[1]);
  return Number.isInteger(port) && port > 0 && port < 65536 ? [port] : [];
}

function listen(server: Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(path, () => resolve());
  });
}

/** `forkd daemon`: run until SIGTERM/SIGINT; running sandboxes are left for the next daemon. */
export async function runDaemon(): Promise<void> {
  const d = await startDaemon();
  const stop = () => {
    void d.close().then(() => process.exit(0));
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
