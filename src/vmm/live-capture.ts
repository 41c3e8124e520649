/**
 * A live BRANCH's memory capture: the private pages of one instant without stopping the guest
 * for their copy. QEMU's own precopy migration (Vm.migrateRam) streams the RAM into
 * `forkd-memsnap live` while the guest runs, pass after pass, keeping only pages private in the
 * VMM; at the switchover QEMU stops the guest and waits (pause-before-switchover): that stop is
 * the branch's instant. The caller freezes the disk and saves the device state then, go() marks
 * the instant and lets QEMU send the pages dirtied since its last pass (the instant's private
 * set is the pages memsnap kept: no pagemap walk while stopped); the guest runs again once the
 * stream ends, and memsnap writes the diff (the format
 * `capture` writes: see native/memsnap/forkd-memsnap.c) in the background.
 *
 * The pause is the last pass plus the disk and device state, whatever the guest wrote before;
 * what it costs instead is the RAM read once by QEMU before the pause. A guest that dirties
 * memory faster than it is sent never reaches the switchover: stopped() times out and the
 * caller takes the stopped copy instead (branch.ts).
 */
import { randomBytes } from "node:crypto";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import { ForkdError } from "../util/index.js";
import { spawnJsonHelper } from "./json-helper.js";
import type { Capture, CaptureStats } from "./memsnap.js";
import type { Vm } from "./vm.js";

/** `FORKD_BRANCH_LIVE`: live capture always (`on`), never (`off`), or above a private size (`auto`). */
export type LiveMode = "auto" | "on" | "off";

export const parseLiveMode = (v: string | undefined): LiveMode => {
  if (v === undefined || v === "" || v === "auto") return "auto";
  if (v === "on" || v === "off") return v;
  throw new ForkdError("invalid_argument", `FORKD_BRANCH_LIVE must be auto, on or off, not ${v}`);
};

/**
 * In `auto`, below this many private bytes the stopped copy is taken: it costs ~0.3 ms per MiB
 * here, less than the live path's fixed cost (its extra QMP round trips and the images QEMU
 * reactivates on resume) and without reading the whole RAM first.
 */
export const LIVE_MIN_BYTES = 32 * 1024 * 1024;

/** The name of the VMM's RAM block: the memory backend's id in config.ts (`-object ...,id=mem`). */
const RAM_BLOCK = "mem";

export interface LiveTimeouts {
  /** Until the first passes are sent and QEMU stops the guest (grows with the RAM). */
  stoppedMs: number;
  /** The stopped part: the last pass and the device state. */
  finishMs: number;
  /** memsnap writing the diff. */
  writeMs: number;
}

const DEFAULT_TIMEOUTS: LiveTimeouts = { stoppedMs: 30_000, finishMs: 30_000, writeMs: 10 * 60_000 };

export interface LiveCapture extends Capture {
  /** The private bytes when it started (memsnap's pre-scan). */
  readonly estimateBytes: number;
  /** Starts the migration; resolves once QEMU has stopped the guest at the switchover. */
  stopped(): Promise<void>;
  /** Ends it unfinished: memsnap killed, the migration cancelled (a guest QEMU stopped runs again). */
  abort(): Promise<void>;
}

export interface LiveCapturer {
  /** Starts `forkd-memsnap live` for `vm`'s mapping of `memfile`; resolves once it listens. */
  start(vm: Vm, memfile: string, diff: string): Promise<LiveCapture>;
}

/** Live capture with forkd-memsnap at `binary`. */
export const forkdLiveCapture = (binary: string, timeouts: Partial<LiveTimeouts> = {}): LiveCapturer => ({
  start: (vm, memfile, diff) => startLive(binary, vm, memfile, diff, { ...DEFAULT_TIMEOUTS, ...timeouts }),
});

/** sockaddr_un holds 108 bytes with its NUL. */
const MAX_SOCKET_PATH = 107;

async function startLive(
  binary: string,
  vm: Vm,
  memfile: string,
  diff: string,
  t: LiveTimeouts,
): Promise<LiveCapture> {
  // In the VMM's own directory: a jailed VMM sees only that (mounted at the same path).
  const sock = join(vm.dir, `.live-${randomBytes(6).toString("hex")}.sock`);
  if (Buffer.byteLength(sock) > MAX_SOCKET_PATH)
    throw new ForkdError("unavailable", `live capture: socket path too long (${sock})`);
  const { child, exited, failure, nextJson, kill } = spawnJsonHelper(
    binary,
    ["live", String(vm.pid), memfile, sock, RAM_BLOCK, diff],
    "live memory capture",
  );
  const cleanup = () => rm(sock, { force: true }).catch(() => undefined);
  let ready: { estimate_bytes: number };
  try {
    ready = await nextJson<{ estimate_bytes: number }>("start", 60_000);
  } catch (e) {
    kill();
    await cleanup();
    throw e;
  }
  let migrating = false;
  const abort = async () => {
    kill();
    await cleanup();
    if (migrating) {
      migrating = false;
      await vm.migrationCancel(t.finishMs);
    }
  };
  const written = (async () => {
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([
      exited,
      new Promise<"timeout">((r) => {
        timer = setTimeout(() => r("timeout"), t.writeMs);
      }),
    ]).finally(() => clearTimeout(timer));
    await cleanup();
    if (code === "timeout") {
      kill();
      throw new ForkdError("timeout", `live memory capture did not finish writing within ${t.writeMs} ms`);
    }
    if (code !== 0) throw await failure("write");
  })();
  written.catch(() => undefined); // awaited by the caller on success; a killed helper is expected
  // No migrate_cancel once written: by then the source runs and its next BRANCH may be
  // migrating (each migrateRam sets its capabilities again; saveState clears them).
  return {
    estimateBytes: ready.estimate_bytes,
    async stopped() {
      migrating = true;
      await vm.migrateRam(`unix:${sock}`);
      // memsnap dying (a stream it cannot read) fails the migration: QEMU then resumes the guest.
      await Promise.race([
        vm.migrationStopped(t.stoppedMs),
        exited.then(async () => {
          throw await failure("stream");
        }),
      ]);
    },
    async go(): Promise<CaptureStats> {
      child.stdin.write("scan\n");
      await nextJson<{ scanned: boolean }>("scan", 10_000);
      const [stats] = await Promise.all([
        nextJson<CaptureStats>("stream", t.finishMs),
        vm.migrationFinish(t.finishMs),
      ]);
      migrating = false;
      return stats;
    },
    written,
    kill: () => void abort().catch(() => undefined),
    abort,
  };
}
