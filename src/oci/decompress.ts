/**
 * A layer's decompressor as a stream: gzip with zlib (multi-member streams too), zstd with the
 * `zstd` program (Node 20's zlib has none), or nothing. A zstd that exits non-zero fails the
 * stream; one that is destroyed is killed.
 */
import { spawn } from "node:child_process";
import { Duplex, PassThrough } from "node:stream";
import { createGunzip } from "node:zlib";
import { ForkdError } from "../util/index.js";
import { childEnv } from "../util/index.js";
import type { Compression } from "./manifest.js";

export function decompressor(c: Compression, what: string): Duplex {
  if (c === "none") return new PassThrough();
  if (c === "gzip") return createGunzip();
  const z = spawn("zstd", ["-d", "-q", "-c", "--no-progress"], {
    stdio: ["pipe", "pipe", "pipe"],
    env: childEnv(),
  });
  let stderr = "";
  z.stderr.on("data", (b: Buffer) => {
    if (stderr.length < 2000) stderr += b.toString("utf8");
  });
  const d = Duplex.from({ writable: z.stdin, readable: z.stdout });
  z.stdin.on("error", () => undefined); // zstd exiting early: its exit status tells why
  z.on("error", (e) => d.destroy(new ForkdError("unavailable", `${what}: cannot run zstd: ${e.message}`)));
  z.on("exit", (code, sig) => {
    if (code !== 0) {
      d.destroy(
        new ForkdError(
          "invalid_argument",
          `${what}: not a valid zstd stream (${
            stderr
              .trim()
              .replace(/^zstd: /, "")
              .slice(0, 300) || `zstd exit ${code ?? sig}`
          })`,
        ),
      );
    }
  });
  d.on("close", () => {
    if (z.exitCode === null && z.signalCode === null) z.kill("SIGKILL");
  });
  return d;
}
