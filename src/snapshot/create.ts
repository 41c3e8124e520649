/**
 * Creating a snapshot: boot a parent VM cold on its own disk layer over a guest image its caller
 * prepared, wait for its agent and warm interpreter, run the start and ready commands and the
 * warm-up, flush the guest's disk cache, and freeze it: device state to a file, RAM already in
 * the memory file. The parent never runs again on that image.
 */
import { randomBytes } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../agent/index.js";
import type { EvalLanguage } from "../agent/index.js";
import { createOverlay, rawSize, rebaseUnsafe } from "../disk/index.js";
import { plainLayerProblem } from "../disk/index.js";
import type { AccelChoice } from "../vmm/index.js";
import type { GuestImage, ImageBuilder } from "../image/index.js";
import type { Progress } from "../util/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { nowMs, since, sleep } from "../util/index.js";
import { GUEST_NET, guestNetArg } from "../net/index.js";
import { defaultCpu, kernelCmdline } from "../vmm/index.js";
import type { MachineConfig } from "../vmm/index.js";
import { takeVmmFile } from "../vmm/index.js";
import { limitsFor } from "../vmm/index.js";
import type { VmmDriver } from "../vmm/index.js";
import type { Vm } from "../vmm/index.js";
import type { ToolRunner } from "../vmm/index.js";
import { nicMeta } from "./meta.js";
import type { SnapshotMeta, SnapshotSource } from "./meta.js";
import { startAndWaitReady } from "./start-ready.js";
import { snapshotFiles } from "./store.js";
import type { SnapshotStore } from "./store.js";
import type { CrashPoint } from "../util/index.js";

export interface CreateSnapshotRequest {
  tag: string;
  /**
   * The guest image the parent boots, prepared by the caller (ImageBuilder.ensure for a
   * template, ensureFromRootfs for a pulled image, a Dockerfile build).
   */
  image: GuestImage;
  /** Where the image came from (recorded as the snapshot's `source`). */
  source: SnapshotSource;
  /** Started in the background in the parent before the warm-up: running in every child. */
  startCmd?: string | null;
  /** Run until it exits 0 (after startCmd), before the warm-up; bounded by readyTimeoutMs. */
  readyCmd?: string | null;
  /** Default 120 s. */
  readyTimeoutMs?: number;
  /** Env and cwd of the commands run in the parent (start, ready, warm): the image's config. */
  execDefaults?: { env?: Record<string, string>; cwd?: string };
  warm?: string | null;
  /** A cell run in a warm kernel before freezing (imports, loaded models, globals). */
  warmEval?: string | null;
  /** The kernel warmEval runs in (default python). */
  warmEvalLanguage?: EvalLanguage;
  memoryMiB: number;
  vcpus: number;
  /** false: no network device in the parent, so none in any child (default true). */
  nic?: boolean;
  /** Deadline for boot, and separately for the warm-up command. */
  bootTimeoutMs?: number;
  warmTimeoutMs?: number;
  /** The tenant it is made for (null or absent: shared, an admin's). */
  owner?: string | null;
  /**
   * Aborted: the creation is cancelled (its client went away, as `docker build` stops at
   * Ctrl-C): the parent VM is killed at once, nothing is published; once published it stays.
   */
  signal?: AbortSignal;
}

/** A guest image made by the caller (a Dockerfile build), with its source and exec defaults. */
export type PreparedImage = Pick<CreateSnapshotRequest, "image" | "source" | "execDefaults">;

/** What a new snapshot is made from: one of forkd's templates, an image reference, or a prepared image. */
export type SnapshotFrom = { template: string } | { image: string } | { prepared: PreparedImage };

/** A creation as the API asks for it: the guest image is the service's to prepare. */
export interface NewSnapshotRequest extends Omit<CreateSnapshotRequest, "image" | "source" | "execDefaults"> {
  from: SnapshotFrom;
}

/** The error of a creation whose client went away before it was published. */
export const cancelled = (tag: string): ForkdError =>
  new ForkdError("conflict", `the creation of snapshot ${tag} was cancelled: its client went away`, { tag });

export interface SnapshotDeps {
  store: SnapshotStore;
  driver: VmmDriver;
  /** Builds the guest images of templates and pulled images (the service's; create takes one). */
  images: ImageBuilder;
  accel: AccelChoice;
  qemuVersion: string;
  runDir: string;
  /** Test-only fault injection (src/util/crash.ts). */
  crash?: CrashPoint;
  /** Runs qemu-img on the layers VMs wrote, jailed (src/vmm/jailed-tools.ts). */
  tools: ToolRunner;
}

export async function createSnapshot(
  deps: SnapshotDeps,
  req: CreateSnapshotRequest,
  progress: Progress = () => undefined,
): Promise<SnapshotMeta> {
  const image = req.image;
  const withNic = req.nic !== false;
  const release = await deps.store.claim(req.tag);
  const suffix = randomBytes(6).toString("hex");
  const staging = deps.store.stagingDir(suffix);
  const runtime = join(deps.runDir, `p-${suffix}`);
  let vm: Vm | null = null;
  let agent: AgentClient | null = null;
  // Cancelled: the parent dies now, so whatever step waits on it fails at once.
  const onAbort = () => void vm?.kill().catch(() => undefined);
  req.signal?.addEventListener("abort", onAbort, { once: true });
  try {
    if (req.signal?.aborted) throw cancelled(req.tag);
    await deps.store.stage(suffix); // = staging
    // A daemon that dies before publishing leaves the tag failed (SnapshotStore.recover), and
    // the next one kills the parent VM still running from run/ (daemon/main.ts).
    await deps.store.markWriting(staging, {
      tag: req.tag,
      started: new Date().toISOString(),
      source: null,
      owner: req.owner ?? null,
    });
    await mkdir(runtime, { recursive: true, mode: 0o700 });
    const files = snapshotFiles(staging);
    // The parent runs the caller's start and warm-up commands: it is jailed like a child (its
    // own uid and cgroup, only its own directory writable, its guest image read-only). It writes
    // its RAM, disk and device state there; they move into the staging directory once it stops.
    const own = {
      memory: join(runtime, "memory"),
      disk: join(runtime, "disk.qcow2"),
      vmstate: join(runtime, "vmstate"),
    };
    await createOverlay(own.disk, {
      backing: image.rootfs,
      backingFormat: "raw",
      sizeBytes: await rawSize(image.rootfs),
    });
    const machine: MachineConfig = {
      memoryMiB: req.memoryMiB,
      vcpus: req.vcpus,
      accel: deps.accel.accel,
      cpu: defaultCpu(deps.accel.accel),
    };

    progress(`boot: starting parent VM (${machine.accel}, ${req.memoryMiB} MiB, ${req.vcpus} vCPU)`, {
      phase: "boot",
    });
    const t0 = nowMs();
    vm = await deps.driver.launch({
      dir: runtime,
      machine,
      memory: { path: own.memory, mode: "parent" },
      disk: own.disk,
      boot: {
        kernel: image.kernel,
        initrd: image.initrd,
        append: kernelCmdline(
          machine.accel,
          deps.accel.tscKhz,
          process.env,
          withNic ? [guestNetArg(GUEST_NET)] : [],
        ),
      },
      // The parent has the device children need, with no connectivity (warm-ups run offline).
      ...(withNic ? { nic: { guest: GUEST_NET, backend: { kind: "none" as const } } } : {}),
      jail: { reads: [image.dir], limits: limitsFor(machine) },
    });
    if (req.signal?.aborted) throw cancelled(req.tag);
    agent = await vm.connectAgent(10_000);
    await waitReady(deps.driver, vm, agent, req.bootTimeoutMs ?? 180_000, runtime);
    const bootMs = since(t0);
    // There is no RTC: the agent sets the parent's clock (and names it) before the warm-up runs.
    await agent.identity({ hostname: "forkd-parent", sandboxId: `snapshot-${req.tag}` });
    progress(`boot: agent ready after ${Math.round(bootMs)} ms`, { phase: "boot" });
    deps.crash?.("create:booted");

    const t1 = nowMs();
    // An image built before forkd-rand.so existed (an unpacked one) has none to preload.
    const hasRand = await agent.stat(RAND_PRELOAD).then(
      (st) => st.type === "file",
      () => false,
    );
    const env = hasRand ? withRandPreload(req.execDefaults?.env) : req.execDefaults?.env;
    const dflt = { ...req.execDefaults, ...(env ? { env } : {}) };
    if (req.startCmd || req.readyCmd) {
      await startAndWaitReady(
        agent,
        {
          startCmd: req.startCmd ?? null,
          readyCmd: req.readyCmd ?? null,
          readyTimeoutMs: req.readyTimeoutMs ?? 120_000,
          ...dflt,
        },
        (line) => progress(line, { phase: "start" }),
      );
    }
    if (req.warm) {
      progress(`warm: ${req.warm}`, { phase: "warm" });
      const out: Buffer[] = [];
      const r = await agent.exec(
        {
          shell: req.warm,
          timeoutMs: req.warmTimeoutMs ?? 600_000,
          ...(dflt.env ? { env: dflt.env } : {}),
          ...(dflt.cwd ? { cwd: dflt.cwd } : {}),
        },
        { onStdout: (d) => out.push(d), onStderr: (d) => out.push(d) },
      ).result;
      if (r.exitCode !== 0) {
        const tail = Buffer.concat(out).toString("utf8").slice(-2000);
        throw new ForkdError(
          "guest_error",
          `warm-up command failed (${r.timedOut ? "timed out" : `exit ${r.exitCode ?? `signal ${r.signal}`}`}): ${tail}`,
        );
      }
    }
    if (req.warmEval) {
      const language = req.warmEvalLanguage ?? "python";
      progress(`warm: evaluating code in the warm ${language} kernel`, { phase: "warm" });
      const r = await agent.eval(req.warmEval, req.warmTimeoutMs ?? 600_000, language);
      if (!r.ok) {
        throw new ForkdError(
          "guest_error",
          `warm-up code failed: ${r.error?.name ?? "error"}: ${r.error?.value ?? ""}`,
          {
            traceback: r.error?.traceback ?? "",
          },
        );
      }
    }
    const warmMs = since(t1);

    progress("freeze: syncing guest disks and saving device state", { phase: "freeze" });
    const t2 = nowMs();
    await agent.sync();
    // Frozen with the link down: children without a network (the default) need no change, and
    // none of them pays for the guest handling the carrier change (it is done before the freeze).
    if (withNic) await vm.setLink(false);
    if (withNic) await waitCarrier(agent, false, 10_000);
    // Keep the agent connected through the save: children restore with the host end connected
    // (they connect before they resume), so the guest never sees its port close and reopen.
    await vm.saveState(own.vmstate);
    agent.close();
    agent = null;
    await vm.stop();
    vm = null;
    // The VMM is gone: its files become the daemon's, in the staging directory.
    await takeVmmFile(own.memory, files.memory, "the parent VM");
    await takeVmmFile(own.disk, files.disk, "the parent VM");
    await takeVmmFile(own.vmstate, files.vmstate, "the parent VM");
    // The layer's header was the VMM's to write: no data file, and the backing file it names is
    // replaced by the image's (a jailed qemu-img reads this layer later: compaction, packs).
    const why = await plainLayerProblem(deps.tools, files.disk);
    if (why !== null) throw new ForkdError("vmm_error", `the parent VM's disk layer is not plain: ${why}`);
    await rebaseUnsafe(deps.tools, files.disk, image.rootfs, "raw", 0o600);
    const freezeMs = since(t2);

    // The image's size, as the layer was made: a size the VMM wrote in its header is not trusted.
    const diskSize = await rawSize(image.rootfs);
    progress("freeze: checksumming memory, device state and disk", { phase: "freeze" });
    const meta = await deps.store.seal(
      staging,
      req.tag,
      {
        template: req.source.kind === "template" ? req.source.name : req.source.kind,
        source: req.source,
        created: new Date().toISOString(),
        status: "ready",
        machine,
        image: {
          hash: image.hash,
          dir: image.dir,
          kernelVersion: image.kernelVersion,
          content: image.content,
        },
        qemu: { binary: deps.driver.binary, version: deps.qemuVersion },
        warm: req.warm ?? null,
        warmEval: req.warmEval ?? null,
        ...(req.warmEval && req.warmEvalLanguage && req.warmEvalLanguage !== "python"
          ? { warmEvalLanguage: req.warmEvalLanguage }
          : {}),
        diskSize,
        files: {},
        timings: { bootMs, warmMs, freezeMs },
        owner: req.owner ?? null,
        ...(withNic ? { nic: nicMeta(GUEST_NET, false) } : {}),
      },
      {
        beforePublish: () => {
          deps.crash?.("create:before-publish");
          if (req.signal?.aborted) throw cancelled(req.tag);
        },
      },
    );
    progress(`snapshot ${req.tag} ready`, { phase: "ready" });
    return meta;
  } catch (e) {
    if (req.signal?.aborted) throw cancelled(req.tag);
    const tail = await deps.driver.consoleTail(runtime, 1500);
    if (e instanceof ForkdError && tail && e.code !== "conflict") {
      e.details.console_tail = tail;
    }
    throw e;
  } finally {
    req.signal?.removeEventListener("abort", onAbort);
    agent?.close();
    if (vm) await vm.kill().catch(() => undefined);
    await rm(staging, { recursive: true, force: true });
    await rm(runtime, { recursive: true, force: true });
    release();
  }
}

/** Waits until the guest has seen its NIC's carrier go `up` or down. */
/** The library that gives OpenSSL its random bytes from the guest kernel (guest/rand/forkd-rand.c). */
export const RAND_PRELOAD = "/.forkd/forkd-rand.so";

/**
 * The env of the commands run in the parent (start_cmd, ready_cmd, warm): what they leave running
 * lives on in every child, so their OpenSSL takes its random bytes from the guest kernel (whose
 * CRNG each child's IDENTITY reseeds) and never from a generator state all children share. The
 * agent does the same for its kernels.
 */
export function withRandPreload(env: Record<string, string> | undefined): Record<string, string> {
  const had = env?.LD_PRELOAD;
  return { ...env, LD_PRELOAD: had ? `${RAND_PRELOAD}:${had}` : RAND_PRELOAD };
}

async function waitCarrier(agent: AgentClient, up: boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let state = "";
  while (Date.now() < deadline) {
    state = (await agent.readFile("/sys/class/net/eth0/operstate", { maxBytes: 64 })).toString().trim();
    if ((state === "up") === up) return;
    await sleep(20);
  }
  throw new ForkdError(
    "guest_error",
    `the guest's eth0 is still ${state || "unknown"} after ${timeoutMs} ms`,
  );
}

/** Pings until the agent and its warm interpreter answer, or the VM dies, or time runs out. */
async function waitReady(
  driver: VmmDriver,
  vm: Vm,
  agent: AgentClient,
  timeoutMs: number,
  runtime: string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastError = "no answer";
  while (Date.now() < deadline) {
    if (vm.exited) {
      throw new ForkdError(
        "vmm_error",
        `parent VM exited during boot: ${await driver.consoleTail(runtime, 800)}`,
      );
    }
    try {
      const p = await agent.ping(3_000);
      if (p.evalReady) return;
      lastError = "warm interpreter not ready";
      await sleep(100);
    } catch (e) {
      lastError = errorMessage(e);
      if (agent.closed) throw new ForkdError("vmm_error", `agent connection lost during boot: ${lastError}`);
    }
  }
  throw new ForkdError("timeout", `parent VM not ready after ${timeoutMs} ms (${lastError})`);
}
