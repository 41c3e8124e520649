/**
 * One real etcd member on loopback for a test (Debian's etcd 3.4): its own data dir and ports,
 * stopped and removed by `stop()`. Multi-member clusters in network namespaces are the local
 * cluster's (src/localcluster/); this is for tests of the store itself.
 */
import { spawn, execFile } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { freePort } from "./port.js";

export interface EtcdMember {
  url: string;
  /** etcdctl with this member's endpoint. */
  ctl(...args: string[]): Promise<string>;
  /** Sends the member a signal (SIGSTOP: it stops answering, as if cut off; SIGCONT: back). */
  signal(sig: NodeJS.Signals): void;
  stop(): Promise<void>;
}

export async function startEtcd(): Promise<EtcdMember> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-etcd-"));
  const client = await freePort();
  const peer = await freePort();
  const url = `http://127.0.0.1:${client}`;
  const log = await open(join(dir, "etcd.log"), "a");
  const proc: ChildProcess = spawn(
    "/usr/bin/etcd",
    [
      "--name=t",
      `--data-dir=${join(dir, "data")}`,
      `--listen-client-urls=${url}`,
      `--advertise-client-urls=${url}`,
      `--listen-peer-urls=http://127.0.0.1:${peer}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${peer}`,
      `--initial-cluster=t=http://127.0.0.1:${peer}`,
      "--logger=zap",
      "--log-outputs=stderr",
    ],
    { stdio: ["ignore", log.fd, log.fd] },
  );
  await log.close();
  const ctl = async (...args: string[]) =>
    (
      await promisify(execFile)("/usr/bin/etcdctl", [`--endpoints=${url}`, ...args], {
        env: { ...process.env, ETCDCTL_API: "3" },
        timeout: 10_000,
      })
    ).stdout;
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      await ctl("endpoint", "health");
      break;
    } catch (e) {
      if (Date.now() > deadline || proc.exitCode !== null) {
        proc.kill("SIGKILL");
        throw new Error(`etcd did not become healthy (log: ${join(dir, "etcd.log")}): ${String(e)}`);
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  return {
    url,
    ctl,
    signal(sig) {
      if (proc.exitCode === null) proc.kill(sig);
    },
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGCONT");
      if (proc.exitCode === null) {
        const exited = new Promise((r) => proc.once("exit", r));
        proc.kill("SIGKILL");
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}
