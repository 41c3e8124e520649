/**
 * BRANCH: turn a running sandbox into a new snapshot with a pause that does not grow with its
 * RAM. While the VM is paused, only what cannot be had later is taken, all at the same instant:
 *   - its disk: the current top layer is frozen (writes go to a new layer) — milliseconds;
 *   - its device state (xen-save-devices-state, ~10 KB);
 *   - its private memory pages (forkd-memsnap: the pages it wrote since its fork; every other
 *     page is still the snapshot's memory file it maps MAP_PRIVATE).
 * It resumes, and the snapshot is finished in the background: the frozen disk layer hard-linked
 * in, then sealed (SnapshotStore.seal: checksums of the diff, device state and disk layer,
 * metadata, publish). Until then the tag
 * reads `writing` (durably: see SnapshotStore.recover). Its memory stays the diff (a format-3
 * snapshot: `memoryBase` names the full image it is relative to; restore.ts writes it into each
 * child), so a branch costs what the sandbox wrote, not its RAM. A sandbox that maps its own
 * image (resumed from a pause) has no snapshot image under it: its branch gets a full image =
 * that image + the private pages, as before.
 */
import { randomBytes } from "node:crypto";
import { chown, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { createOverlay, flattenLayers } from "../disk/index.js";
import type { ToolRunner } from "../vmm/index.js";
import { linkOrCopy } from "../util/index.js";
import { nicMeta } from "../snapshot/index.js";
import type { SnapshotMeta } from "../snapshot/index.js";
import { memoryDiffFile } from "../snapshot/index.js";
import type { Snapshot, SnapshotStore } from "../snapshot/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { assertKey, newSandboxId } from "../util/index.js";
import { keyIn, splitKey } from "../snapshot/index.js";
import type { Logger } from "../util/index.js";
import type { Capture, CaptureStats, MemoryDiffs } from "../vmm/index.js";
import { LIVE_MIN_BYTES } from "../vmm/index.js";
import type { LiveCapture, LiveCapturer, LiveMode } from "../vmm/index.js";
import type { Vm } from "../vmm/index.js";
import { nowMs, since } from "../util/index.js";
import type { CrashPoint } from "../util/index.js";
import type { SandboxContext } from "./context.js";
import { armDiskLimit } from "./disk-limit.js";
import { notInTransition, transit } from "./transition.js";
import type { Sandbox } from "./sandbox.js";

/**
 * The owner of a private branch of an admin's sandbox: no tenant can hold it (tenants match
 * TENANT_RE, which never starts with "@"), so only admins see, fork or delete it. An admin's
 * snapshots are otherwise shared (owner null), as templates are; a branch carries the source's
 * memory and disk, which E2B's API keeps to its team.
 */
export const ADMIN_ONLY_OWNER = "@admin";

/** Who owns a branch of `s`: its tenant; for an admin's sandbox, the admins alone when `private`. */
export const branchOwner = (s: Sandbox, priv: boolean): string | null =>
  s.record.owner ?? (priv ? ADMIN_ONLY_OWNER : null);

export interface BranchDeps {
  store: SnapshotStore;
  /** Captures and applies private memory pages (forkd-memsnap). */
  memsnap: MemoryDiffs;
  /** Captures the private pages live (QEMU's precopy; src/vmm/live-capture.ts), per `liveMode`. */
  live?: LiveCapturer | null;
  /** on: always live; auto: live above LIVE_MIN_BYTES private; off (default): stopped copies only. */
  liveMode?: LiveMode;
  /** Called (paused) once the source writes to a new top disk layer. */
  newTopLayer?: () => Promise<void>;
  /** Test-only fault injection (src/util/crash.ts). */
  crash?: CrashPoint;
  log: Logger;
  /** Runs qemu-img on the source's layers (its VMM wrote them), jailed (src/vmm/jailed-tools.ts). */
  tools: ToolRunner;
}

export interface BranchStarted {
  tag: string;
  pauseMs: number;
  privateBytes: number;
  /** Settles when the snapshot is published (or failed and cleaned up). */
  done: Promise<Snapshot>;
}

export interface BranchResult {
  tag: string;
  status: "ready" | "writing";
  pauseMs: number;
  privateBytes: number;
  snapshot: Snapshot | null;
}

/**
 * BRANCH of the running sandbox `id` as key `tag` (default br-<random> in the namespace of its
 * tenant, src/snapshot/namespace.ts; a key given must be in it): one transition at a time, the
 * sandbox counts as in use meanwhile. Returns once the source runs again; with `wait`, once the
 * snapshot is ready too.
 */
export async function branch(
  ctx: SandboxContext,
  id: string,
  tag: string | undefined,
  wait: boolean,
  priv = false,
): Promise<BranchResult> {
  const s = ctx.live.running(id);
  const memsnap = ctx.memsnap;
  if (!memsnap) throw new ForkdError("unavailable", "branching needs native/memsnap/forkd-memsnap");
  ctx.cluster?.admit("branch");
  notInTransition(s);
  const ns = s.record.owner ?? null;
  const name = assertKey(tag ?? keyIn(ns, `br-${newSandboxId().slice(3, 15)}`));
  if (splitKey(name).ns !== ns)
    throw new ForkdError(
      "invalid_argument",
      `a branch of sandbox ${id} is tagged in ${ns ?? "the admins"}'s namespace`,
      {
        field: "tag",
      },
    );
  s.busy++;
  let started;
  try {
    started = await transit(s, "branch", async () => {
      const st = await branchSandbox(
        {
          store: ctx.store,
          memsnap,
          live: ctx.liveCapture,
          liveMode: ctx.branchLive,
          log: ctx.log,
          // Its writes now go to a new top layer: the limit counts the frozen one too.
          newTopLayer: () => armDiskLimit(ctx, s),
          crash: ctx.crash,
          tools: ctx.tools,
        },
        s,
        name,
        priv,
      );
      // Counted before the transition ends: a kill() waiting on it keeps the files this reads.
      const finishing = st.done.then(
        () => undefined,
        () => undefined,
      );
      s.finishing.add(finishing);
      void finishing.then(() => s.finishing.delete(finishing));
      return st;
    });
  } finally {
    s.busy--;
    s.lastUsed = Date.now();
  }
  const base = { tag: name, pauseMs: started.pauseMs, privateBytes: started.privateBytes };
  if (!wait) return { ...base, status: "writing", snapshot: null };
  return { ...base, status: "ready", snapshot: await started.done };
}

/** The memory file a sandbox's VMM maps: its snapshot's, or its own paused image once resumed. */
export const memoryFileOf = (s: Sandbox, source: Snapshot): string =>
  s.record.memoryFile ?? source.files.memory;

/**
 * The snapshot whose full image `s` maps, which a diff captured from it is relative to: its
 * snapshot's memory base (a diff snapshot's children map that image), or its snapshot itself;
 * null when it maps its own paused image.
 */
export function memoryBaseFor(s: Sandbox, source: Snapshot): NonNullable<SnapshotMeta["memoryBase"]> | null {
  if (s.record.memoryFile) return null;
  return source.meta.memoryBase ?? { tag: source.meta.tag, checksum: source.meta.files.memory.sha256 };
}

export async function branchSandbox(
  deps: BranchDeps,
  s: Sandbox,
  tag: string,
  priv = false,
): Promise<BranchStarted> {
  const { store } = deps;
  const vm = s.vm;
  if (!vm || s.state !== "running") throw new ForkdError("conflict", `sandbox ${s.record.id} is not running`);
  const source = await store.get(s.record.tag);
  const release = await store.claim(tag);
  const suffix = `${tag}-${Date.now().toString(36)}`;
  const staging = store.stagingDir(suffix);
  const started = new Date().toISOString();
  let paused = false;
  try {
    await store.stage(suffix);
    // A branch belongs to its sandbox's tenant (an admin's private one: to the admins).
    const owner = branchOwner(s, priv);
    await store.markWriting(staging, { tag, started, source: s.record.id, owner });
    // Unique without a counter: layers made within one millisecond (a resume, a branch) differ.
    const newTop = join(s.dir, `disk-${Date.now().toString(36)}-${randomBytes(4).toString("hex")}.qcow2`);
    const diff = memoryDiffFile(staging);

    // Everything that can be done before the pause is: the new top layer is created now (over
    // the current top, which is frozen at the pause) and only opened during it.
    const top = await vm.diskTop();
    await createOverlay(newTop, {
      backing: top,
      backingFormat: "qcow2",
      sizeBytes: source.meta.diskSize,
    });
    // A jailed VMM opens it as its own uid.
    if (vm.owner) await chown(newTop, vm.owner.uid, vm.owner.gid);

    // The memory helper pre-scans and prepares its buffer while the VM still runs; a live
    // capture streams the RAM meanwhile, and its instant is when QEMU stops the guest.
    const memfile = memoryFileOf(s, source);
    let live = await startLive(deps, vm, memfile, diff);
    let capture: Capture | null = null;
    const abort = async () => {
      if (live) await live.abort().catch(() => undefined);
      capture?.kill();
    };
    // The pause starts when the guest stops: QEMU's stop at the switchover, or vm.pause() below.
    let stoppedAt = 0;
    if (live) {
      try {
        await live.stopped();
        stoppedAt = nowMs();
        paused = true;
        deps.crash?.("branch:live-stopped");
      } catch (e) {
        await abort();
        if (deps.liveMode === "on") throw e;
        // A guest dirtying memory faster than it is sent never gets there: copy it stopped.
        deps.log.warn("branch: live capture failed, taking a stopped copy", { tag, error: errorMessage(e) });
        live = null;
        await rm(diff, { force: true });
      }
    }
    if (!live) capture = await deps.memsnap.capture(vm.pid, memfile, diff);
    const cap0: Capture | LiveCapture = live ?? (capture as Capture);
    const t0 = live ? stoppedAt : nowMs();
    let t = t0;
    const lap = () => {
      const ms = Math.round(since(t) * 10) / 10;
      t = nowMs();
      return ms;
    };
    try {
      if (!paused) await vm.pause();
      paused = true;
    } catch (e) {
      await abort();
      throw e;
    }
    const stopMs = lap();
    let frozen: string;
    let cap: CaptureStats;
    try {
      frozen = await vm.freezeDisk(newTop);
      await deps.newTopLayer?.();
      await vm.saveDevicesState(join(staging, "vmstate"));
      cap = await cap0.go();
    } catch (e) {
      await abort();
      throw e;
    }
    deps.crash?.("branch:paused");
    const memoryMs = lap();
    await vm.resume();
    paused = false;
    const pauseMs = since(t0);
    deps.log.info("branch: source resumed", {
      id: s.record.id,
      tag,
      pause_ms: pauseMs,
      private_bytes: cap.bytes,
      phases_ms: { stop: stopMs, capture: memoryMs, cont: lap() },
      live: live !== null,
      memsnap: cap,
    });

    const args = {
      source,
      frozenIsFirst: frozen === join(s.dir, "disk.qcow2"),
      base: memoryFileOf(s, source),
      memoryBase: memoryBaseFor(s, source),
      staging,
      frozen,
      diff,
      tag,
      sandbox: s.record.id,
      pauseMs,
      bytes: cap.bytes,
      owner,
      linkUp: (s.record.network?.mode ?? "none") !== "none",
      within: [s.dir, ...(await store.chainDirs(source)), source.meta.image.dir],
    };
    const done = cap0.written
      .then(() => finish(deps, args))
      .catch(async (e: unknown) => {
        deps.log.warn("branch: failed", { tag, error: errorMessage(e) });
        await rm(staging, { recursive: true, force: true });
        throw e;
      })
      .finally(release);
    store.track({ tag, started, source: s.record.id, owner }, done);
    done.catch(() => undefined);
    return { tag, pauseMs, privateBytes: cap.bytes, done };
  } catch (e) {
    if (paused) await vm.resume().catch(() => undefined);
    await rm(staging, { recursive: true, force: true });
    release();
    throw e instanceof ForkdError
      ? e
      : new ForkdError("vmm_error", `branch failed: ${errorMessage(e)}`, {}, e);
  }
}

/**
 * The live capture this branch takes (deps.liveMode), started and listening; null: the stopped
 * copy. In auto, a source with few private pages takes the stopped copy (already fast).
 */
async function startLive(
  deps: BranchDeps,
  vm: Vm,
  memfile: string,
  diff: string,
): Promise<LiveCapture | null> {
  const mode = deps.liveMode ?? "off";
  if (mode === "off") return null;
  if (!deps.live) {
    if (mode === "on") throw new ForkdError("unavailable", "live branch capture needs forkd-memsnap");
    return null;
  }
  let live: LiveCapture;
  try {
    live = await deps.live.start(vm, memfile, diff);
  } catch (e) {
    if (mode === "on") throw e;
    deps.log.warn("branch: live capture unavailable, taking a stopped copy", { error: errorMessage(e) });
    await rm(diff, { force: true });
    return null;
  }
  if (mode === "auto" && live.estimateBytes < LIVE_MIN_BYTES) {
    await live.abort();
    await rm(diff, { force: true });
    return null;
  }
  return live;
}

interface FinishArgs {
  source: Snapshot;
  /** The frozen layer is the source's first (its backing file is the snapshot's disk). */
  frozenIsFirst: boolean;
  /** The memory file the source maps (its snapshot's, or its own after a resume). */
  base: string;
  /** The snapshot whose image `base` is (the diff is stored relative to it); null: a full image. */
  memoryBase: NonNullable<SnapshotMeta["memoryBase"]> | null;
  staging: string;
  frozen: string;
  diff: string;
  tag: string;
  sandbox: string;
  pauseMs: number;
  bytes: number;
  owner: string | null;
  /** The source's NIC link state, which its device state saved. */
  linkUp: boolean;
  /** Where its disk chain's files may be: its own directory, its snapshot chain, its image. */
  within: string[];
}

/** Builds and publishes the snapshot from what the pause captured (source already running). */
async function finish(deps: BranchDeps, a: FinishArgs): Promise<Snapshot> {
  const t0 = nowMs();
  const files = {
    memory: join(a.staging, "memory"),
    memoryDiff: memoryDiffFile(a.staging),
    disk: join(a.staging, "disk.qcow2"),
  };
  if (a.frozenIsFirst) {
    // The source's first layer (over its snapshot's disk), immutable from now on: share it.
    await linkOrCopy(a.frozen, files.disk);
  } else {
    // After earlier branches (or a pause) the source's disk is a chain of layers in its own
    // directory, which goes when it does: flatten them into one layer over the snapshot's disk.
    // (Never rebase the frozen file in place: the running source reads it as a backing file.)
    await flattenLayers(
      deps.tools,
      a.frozen,
      { path: a.source.files.disk, format: "qcow2" },
      files.disk,
      a.within,
    );
  }
  // A diff snapshot keeps the captured diff as its memory (memory.diff: capture wrote it there);
  // the base image's checksum is the one its snapshot recorded, never hashed again here.
  const diffOnly = a.memoryBase !== null;
  if (!diffOnly) {
    await deps.memsnap.apply(a.base, a.diff, files.memory);
    await rm(a.diff, { force: true });
  } else if (a.diff !== files.memoryDiff) {
    await rename(a.diff, files.memoryDiff);
  }
  const src = a.source.meta;
  await deps.store.seal(
    a.staging,
    a.tag,
    {
      template: src.template,
      source: src.source,
      created: new Date().toISOString(),
      status: "ready",
      machine: src.machine,
      image: src.image,
      qemu: src.qemu,
      warm: src.warm,
      warmEval: src.warmEval,
      ...(src.warmEvalLanguage !== undefined ? { warmEvalLanguage: src.warmEvalLanguage } : {}),
      diskSize: src.diskSize,
      // A diff snapshot's image is its base's: the sum its snapshot recorded.
      files: diffOnly ? { memory: src.files.memory } : {},
      timings: { bootMs: 0, warmMs: 0, freezeMs: a.pauseMs },
      stateFormat: "devices",
      nic: src.nic ? nicMeta(src.nic, a.linkUp) : undefined,
      parent: { tag: src.tag, checksum: src.checksum },
      ...(a.memoryBase ? { memoryBase: a.memoryBase } : {}),
      branch: { sandbox: a.sandbox, pauseMs: a.pauseMs, privateBytes: a.bytes, finishMs: since(t0) },
      owner: a.owner,
    },
    { beforePublish: () => deps.crash?.("branch:before-publish") },
  );
  deps.log.info("branch: snapshot ready", { tag: a.tag, finish_ms: since(t0) });
  return deps.store.get(a.tag);
}
