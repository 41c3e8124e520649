/**
 * A real OCI registry for tests: Debian's docker-registry (distribution 2.8) serving plain http
 * on a free port of loopback (or of an address in a test's network namespace), storing in a
 * temp directory. Installed by scripts/setup-host.sh.
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { open, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { freePort } from "./port.js";

export const REGISTRY_BIN = "/usr/bin/docker-registry";

export interface TestRegistry {
  /** host:port, for references. */
  host: string;
  /** Where blobs live: <storage>/docker/registry/v2/blobs/sha256/<2>/<hex>/data */
  storage: string;
  blobPath(digest: string): string;
  stop(): Promise<void>;
}

/**
 * Starts a registry storing under `dir`: on loopback, or (`netns`, `address`) on an address
 * inside a network namespace a test made (a cluster's node: its peers reach it there).
 */
export async function startRegistry(
  dir: string,
  at: { netns: string; address: string } | null = null,
): Promise<TestRegistry> {
  const port = await freePort();
  const host = `${at?.address ?? "127.0.0.1"}:${port}`;
  const storage = join(dir, "storage");
  const config = join(dir, "config.yml");
  await writeFile(
    config,
    [
      "version: 0.1",
      "log:",
      "  level: warn",
      "storage:",
      "  filesystem:",
      `    rootdirectory: ${storage}`,
      "  delete:",
      "    enabled: true",
      "http:",
      `  addr: ${host}`,
      "",
    ].join("\n"),
  );
  const log = await open(join(dir, "registry.log"), "a");
  const [cmd, args] = at
    ? ["ip", ["netns", "exec", at.netns, REGISTRY_BIN, "serve", config]]
    : [REGISTRY_BIN, ["serve", config]];
  // (`ip netns exec` execs the registry: the child is the registry itself.)
  const proc: ChildProcess = spawn(cmd, args, { stdio: ["ignore", log.fd, log.fd] });
  await log.close();
  const exited = new Promise((r) => proc.once("exit", r));
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`docker-registry exited: see ${dir}/registry.log`);
    const ok = await fetch(`http://${host}/v2/`).then(
      (r) => r.status === 200,
      () => false,
    );
    if (ok) break;
    if (Date.now() > deadline) throw new Error(`docker-registry did not answer: see ${dir}/registry.log`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    host,
    storage,
    blobPath: (digest) => {
      const hex = digest.replace(/^sha256:/, "");
      return join(storage, "docker/registry/v2/blobs/sha256", hex.slice(0, 2), hex, "data");
    },
    async stop() {
      if (proc.exitCode === null) {
        proc.kill("SIGTERM");
        await exited;
      }
    },
  };
}
