/**
 * A VMM's private memory pages as a diff over the memory file it maps MAP_PRIVATE, and a diff
 * applied back onto that file (or written into a stopped VMM's mapping of it): how a pause and a BRANCH save RAM without stopping for its size.
 * `MemoryDiffs` is what the sandbox service needs; forkdMemsnap() is native/memsnap's
 * forkd-memsnap (capture reads /proc/PID/mem of the paused VMM); tests inject a fake.
 */
import { ForkdError } from "../util/index.js";
import { run } from "../util/index.js";
import { spawnJsonHelper } from "./json-helper.js";

export interface MemoryDiffs {
  /** Starts capturing VMM `pid`'s private pages of `memfile` into `diff`; resolves once ready. */
  capture(pid: number, memfile: string, diff: string): Promise<Capture>;
  /** Writes `out`: `base` with `diff`'s pages over it. */
  apply(base: string, diff: string, out: string): Promise<void>;
  /**
   * Writes `diff`'s pages into stopped VMM `pid`'s mapping of `memfile` (the file the diff is
   * relative to): its guest RAM becomes the file + the diff, without a full image on disk.
   */
  inject(pid: number, memfile: string, diff: string): Promise<void>;
}

/** forkd-memsnap at `binary`. */
export const forkdMemsnap = (binary: string): MemoryDiffs => ({
  capture: (pid, memfile, diff) => startCapture(binary, pid, memfile, diff),
  apply: async (base, diff, out) => {
    await run(binary, ["apply", base, diff, out], { timeoutMs: 600_000 });
  },
  inject: async (pid, memfile, diff) => {
    await run(binary, ["inject", String(pid), memfile, diff], { timeoutMs: INJECT_TIMEOUT_MS });
  },
});

/** Writing a diff into a VMM is bounded by reading it from disk: a whole RAM's worth is seconds. */
const INJECT_TIMEOUT_MS = 120_000;

const WRITE_TIMEOUT_MS = 10 * 60_000;

export interface CaptureStats {
  pages: number;
  bytes: number;
  runs: number;
  scan_ms: number;
  copy_ms: number;
}

export interface Capture {
  /** Tells the helper the VM is paused; resolves when it has copied the pages. */
  go(): Promise<CaptureStats>;
  /** Resolves when the diff file is written and the helper exited cleanly. */
  written: Promise<void>;
  kill(): void;
}

/** Starts forkd-memsnap capture and waits until it is ready (its buffer faulted in). */
async function startCapture(memsnap: string, pid: number, memfile: string, diff: string): Promise<Capture> {
  const { child, exited, failure, nextJson, kill } = spawnJsonHelper(
    memsnap,
    ["capture", String(pid), memfile, diff],
    "memory capture",
  );
  try {
    await nextJson<{ ready: boolean }>("start", 60_000);
  } catch (e) {
    kill();
    throw e;
  }
  const written = (async () => {
    // Writing the diff is bounded by the disk; a helper stuck longer than this is killed, so a
    // branch never stays `writing` (and a pause never hangs) forever.
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([
      exited,
      new Promise<"timeout">((r) => {
        timer = setTimeout(() => r("timeout"), WRITE_TIMEOUT_MS);
      }),
    ]).finally(() => clearTimeout(timer));
    if (code === "timeout") {
      kill();
      throw new ForkdError("timeout", `memory capture did not finish writing within ${WRITE_TIMEOUT_MS} ms`);
    }
    if (code !== 0) throw await failure("write");
  })();
  written.catch(() => undefined); // awaited by the caller on success; a killed helper is expected
  return {
    async go() {
      child.stdin.write("go\n");
      return nextJson<CaptureStats>("copy", 60_000);
    },
    written,
    kill,
  };
}
