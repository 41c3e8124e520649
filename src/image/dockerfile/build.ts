/**
 * Building a guest image from a Dockerfile. FROM resolves (an injected resolver) to a base
 * GuestImage and its config; each RUN/COPY/ADD step, and a last step writing the image config
 * (/.forkd/env, /.forkd/config), is one cached qcow2 layer keyed by its parent's key, the step
 * and the files it copies (step-cache.ts). The steps not cached run in one build VM booted on
 * the last cached layer: after each step the guest syncs, the VM pauses, its disk's top layer is
 * frozen live (blockdev-snapshot-sync onto a new empty layer) and it resumes for the next step;
 * the frozen layers are committed in order once the VM is gone (a step a concurrent build
 * committed first ends this build's commits: commit-chain.ts). The chain is then flattened to
 * a raw ext4 (install.ts) that create.ts snapshots. An unchanged rebuild boots nothing.
 *
 * The build VM gets a network like a sandbox with egress allowed (deps.network: a netns slot, so
 * the host's own services stay out of reach), or none where the host has none to give. A step
 * runs as the user USER (or the base image's config) names, as Docker runs it.
 *
 * The build VM runs the caller's RUN steps, so it is jailed like a sandbox's (src/vmm/jail.ts):
 * its own uid, no capabilities, a cgroup with its memory, CPU and tasks limits, and a mount
 * namespace showing only its own directory (its RAM and the step layers it writes, under the
 * daemon's run/, never the shared cache) and, read-only, its base image and the cached layers it
 * boots on. What it wrote is taken once it is gone (vmm/jail-files.ts) and checked before root
 * uses it: plain qcow2 layers (disk/plain-layer.ts), rebased onto the chain root chose, within
 * the build's disk cap. Cache keys are the owner's own (keys.ts).
 */
import { randomBytes } from "node:crypto";
import type { BaseSource } from "../source.js";
import { lchown, lstat, mkdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { AgentClient } from "../../agent/index.js";
import { createOverlay, rawSize, rebaseUnsafe } from "../../disk/index.js";
import { plainLayerProblem } from "../../disk/index.js";
import type { AccelChoice } from "../../vmm/index.js";
import type { Attachment } from "../../net/index.js";
import { GUEST_NET, guestNetArg } from "../../net/index.js";
import type { Progress } from "../../util/index.js";
import { ForkdError, errorMessage } from "../../util/index.js";
import { nowMs, since, sleep } from "../../util/index.js";
import { defaultCpu, kernelCmdline } from "../../vmm/index.js";
import type { MachineConfig } from "../../vmm/index.js";
import type { VmmDriver } from "../../vmm/index.js";
import { takeVmmFile } from "../../vmm/index.js";
import { limitsFor } from "../../vmm/index.js";
import type { Vm } from "../../vmm/index.js";
import type { ToolRunner } from "../../vmm/index.js";
import type { GuestImage } from "../builder.js";
import { commitChain } from "./commit-chain.js";
import { BuildContext, hashItems } from "./context.js";
import type { CopyItem } from "./context.js";
import { copyStep, runStep } from "./steps.js";
import { configFiles } from "./image-config.js";
import { installImage } from "./install.js";
import { stepKeys } from "./keys.js";
import { parseDockerfile } from "./parse.js";
import { fromRef, plan } from "./plan.js";
import type { BuildArgs, ImageConfig } from "./plan.js";
import { StepCache } from "./step-cache.js";

/** What FROM resolves to: a guest image to boot and the config its steps start from. */
export interface BaseImage {
  image: GuestImage;
  config: ImageConfig;
  /** Where it came from, for the snapshot's source (e.g. {kind:"image", ref, digest}). */
  source: BaseSource;
}

/** FROM's reference to a base image (after the merge: ImagePuller.ensure + ImageBuilder.ensureFromRootfs). */
export type FromResolver = (ref: string, progress: Progress, signal?: AbortSignal) => Promise<BaseImage>;

/** Gives the build VM a network (the sandboxes' attachments, egress allowed under their host rules). */
export type BuildNetwork = () => Promise<Attachment>;

export interface DockerfileDeps {
  cacheDir: string;
  driver: VmmDriver;
  accel: AccelChoice;
  runDir: string;
  resolve: FromResolver;
  /** Absent, or failing: the build VM has no network (said in the progress). */
  network?: BuildNetwork;
  /**
   * Pins a cache entry the build stands on (its base image, its last cached layer, a finished
   * image) until the caller's snapshot is made; false: it was collected (src/cache/pins.ts).
   */
  pin?: (path: string) => Promise<boolean>;
  /** Runs qemu-img and e2fsck on the layers the build VM wrote, jailed (src/vmm/jailed-tools.ts). */
  tools: ToolRunner;
}

export interface DockerfileBuildRequest {
  /** The Dockerfile's text. */
  dockerfile: string;
  /** The build context on the host (already filtered by .dockerignore, or it is applied here). */
  contextDir: string;
  buildArgs?: BuildArgs;
  memoryMiB?: number;
  vcpus?: number;
  /** Whose build it is (a tenant; null: an admin): the step cache is each owner's own (keys.ts). */
  owner: string | null;
  /**
   * What the build's step layers may hold together, in MiB (the tenant's max_build_disk_mib:
   * src/access/build-caps.ts); absent or null: no cap.
   */
  maxDiskMiB?: number | null;
  /** Deadline of one RUN step (default 30 min). */
  stepTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface DockerfileBuildResult {
  image: GuestImage;
  config: ImageConfig;
  from: { ref: string; source: BaseSource };
  /** The final step's key (the image's build hash). */
  key: string;
  /** Each step: its Dockerfile line (0: the config step) and whether its layer was cached. */
  steps: Array<{ line: number; what: string; cached: boolean }>;
}

/** A step with its cache key, ready to run. */
interface KeyedStep {
  key: string;
  line: number;
  what: string;
  run: (agent: AgentClient) => Promise<void>;
}

export async function buildDockerfile(
  deps: DockerfileDeps,
  req: DockerfileBuildRequest,
  progress: Progress = () => undefined,
): Promise<DockerfileBuildResult> {
  const df = parseDockerfile(req.dockerfile);
  const from = fromRef(df, req.buildArgs);
  progress(`from: resolving ${from.ref}`, { phase: "image" });
  const base = await deps.resolve(from.ref, progress, req.signal);
  const pin = async (path: string) => {
    if (deps.pin && !(await deps.pin(path)))
      throw new ForkdError("unavailable", `${path} was collected from the cache while in use; try again`);
  };
  await pin(base.image.dir);
  const p = plan(df, base.config, req.buildArgs);
  const context = await BuildContext.scan(req.contextDir);
  const cache = new StepCache(deps.cacheDir);

  // What each COPY or ADD copies (its files are part of its key), then the keys (keys.ts).
  const copies = new Map<number, { items: CopyItem[]; files: string }>();
  for (const [i, s] of p.steps.entries()) {
    if (s.kind !== "copy") continue;
    const items = context.resolve(s.line, s.add ? "ADD" : "COPY", s.sources, s.dest);
    if (s.add) await context.refuseArchives(s.line, items);
    copies.set(i, { items, files: await hashItems(items) });
  }
  const keys = stepKeys(req.owner, base.image.content, p, (i) => copies.get(i)?.files ?? "");
  const keyed: KeyedStep[] = [];
  const stepTimeoutMs = req.stepTimeoutMs ?? 30 * 60_000;
  for (const [i, s] of p.steps.entries()) {
    const n = i + 1;
    const key = keys.steps[i] ?? "";
    if (s.kind === "run") {
      const what = `RUN ${"exec" in s.command ? JSON.stringify(s.command.exec) : s.command.shell}`;
      keyed.push({ key, line: s.line, what, run: (a) => runStep(a, s, n, stepTimeoutMs, progress) });
    } else {
      const items = copies.get(i)?.items ?? [];
      const what = `${s.add ? "ADD" : "COPY"} ${s.sources.join(" ")} ${s.dest}`;
      keyed.push({ key, line: s.line, what, run: (a) => copyStep(a, s, items, stepTimeoutMs) });
    }
  }
  const cfg = configFiles(p.config);
  keyed.push({
    key: keys.final,
    line: 0,
    what: "image config (/.forkd/env, /.forkd/config)",
    run: async (a) => {
      if (p.config.workingDir) await a.mkdir(p.config.workingDir, { parents: true, mode: 0o755 });
      await a.mkdir("/.forkd", { parents: true, mode: 0o755 });
      await a.writeFile("/.forkd/env", cfg.env, { mode: 0o644 });
      await a.writeFile("/.forkd/config", cfg.config, { mode: 0o644 });
    },
  });
  const finalKey = keys.final;

  // The first step not cached; everything before it is reused.
  let first = 0;
  while (first < keyed.length && (await cache.has(keyed[first]?.key ?? ""))) first++;
  const steps = keyed.map((k, i) => ({ line: k.line, what: k.what, cached: i < first }));
  for (const [i, k] of keyed.slice(0, first).entries()) {
    progress(`step ${i + 1}/${keyed.length}: ${k.what}: cached`, { phase: "step" });
  }
  // The chain the build boots on: its last cached layer stands on every one before it.
  if (first > 0) await pin(dirname(cache.layer(keyed[first - 1]?.key ?? "")));
  const done = first === keyed.length ? await cache.result(finalKey) : null;
  if (done) await pin(join(cache.imagesDir(), done));
  const installed = async (address: string) => ({
    image: await installedImage(cache, address, base.image, finalKey),
    config: p.config,
    from: { ref: from.ref, source: base.source },
    key: finalKey,
    steps,
  });
  if (done) {
    progress("build: every step cached", { phase: "step" });
    return installed(done);
  }
  const work = await cache.workDir();
  try {
    let top = cache.layer(finalKey);
    if (first < keyed.length) {
      const parentLayer =
        first === 0
          ? { path: base.image.rootfs, format: "raw" as const }
          : { path: cache.layer(keyed[first - 1]?.key ?? ""), format: "qcow2" as const };
      top = await runSteps(deps, req, base.image, parentLayer, keyed, first, work, cache, progress);
    }
    progress("flatten: writing the root filesystem", { phase: "flatten" });
    const address = await installImage({
      top,
      base: base.image,
      key: finalKey,
      work,
      imagesDir: cache.imagesDir(),
      extra: { from: from.ref, source: base.source, config: p.config },
      tools: deps.tools,
      within: [cache.root],
    });
    await cache.setResult(finalKey, address);
    return await installed(address);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

async function installedImage(
  cache: StepCache,
  address: string,
  base: GuestImage,
  key: string,
): Promise<GuestImage> {
  const dir = join(cache.imagesDir(), address);
  return {
    hash: key,
    content: address,
    dir,
    template: base.template,
    kernel: join(dir, "vmlinuz"),
    initrd: join(dir, "initrd.img"),
    rootfs: join(dir, "rootfs.ext4"),
    kernelVersion: base.kernelVersion,
  };
}

/**
 * Boots one build VM on `parentLayer` and runs steps `first..` of `keyed`, committing each layer;
 * returns the top layer of this build's chain (the cached final layer, unless a concurrent build
 * took a key first: then this build's own file, in `work`).
 */
async function runSteps(
  deps: DockerfileDeps,
  req: DockerfileBuildRequest,
  image: GuestImage,
  parentLayer: { path: string; format: "raw" | "qcow2" },
  keyed: KeyedStep[],
  first: number,
  work: string,
  cache: StepCache,
  progress: Progress,
): Promise<string> {
  // The VM's own directory (jailed: the only one it may write): its RAM, sockets, console and
  // the step layers it writes. A layer root creates there has a name the VM cannot guess, so it
  // cannot have put a link in its place.
  const runtime = join(deps.runDir, `b-${work.slice(-12)}`);
  await mkdir(runtime, { recursive: true, mode: 0o700 });
  const own = (i: number) => join(runtime, `step-${i}-${randomBytes(6).toString("hex")}.qcow2`);
  const layers = new Map<number, string>([[first, own(first)]]);
  const layerOf = (i: number): string => layers.get(i) ?? "";
  // Every layer of the chain has the base image's size: no layer the VM wrote is opened to learn it.
  const sizeBytes = await rawSize(image.rootfs);
  await createOverlay(layerOf(first), {
    backing: parentLayer.path,
    backingFormat: parentLayer.format,
    sizeBytes,
  });
  const machine: MachineConfig = {
    memoryMiB: req.memoryMiB ?? 512,
    vcpus: req.vcpus ?? 1,
    accel: deps.accel.accel,
    cpu: defaultCpu(deps.accel.accel),
  };
  const capBytes = req.maxDiskMiB ? req.maxDiskMiB * 2 ** 20 : null;
  const overCap = () =>
    new ForkdError(
      "resource_exhausted",
      `the build wrote more than this tenant's build disk cap of ${req.maxDiskMiB ?? 0} MiB (max_build_disk_mib)`,
      { cap: "max_build_disk_mib", limit: req.maxDiskMiB ?? 0 },
    );
  let over = false;
  let vm: Vm | null = null;
  let agent: AgentClient | null = null;
  let net: Attachment | null = null;
  const frozen: number[] = [];
  // Cancelled (its client went away): the build VM dies now, so the step in progress ends too.
  const onAbort = () => void vm?.kill().catch(() => undefined);
  req.signal?.addEventListener("abort", onAbort, { once: true });
  try {
    try {
      if (deps.network) {
        try {
          net = await deps.network();
        } catch (e) {
          progress(`network: none for this build (${errorMessage(e)})`, { phase: "boot" });
        }
      } else progress("network: none for this build (this daemon gives builds none)", { phase: "boot" });
      progress(`boot: starting the build VM (${machine.accel}, ${machine.memoryMiB} MiB)`, { phase: "boot" });
      const t0 = nowMs();
      vm = await deps.driver.launch(
        {
          dir: runtime,
          machine,
          memory: { path: join(runtime, "memory"), mode: "parent" },
          disk: layerOf(first),
          boot: {
            kernel: image.kernel,
            initrd: image.initrd,
            append: kernelCmdline(machine.accel, deps.accel.tscKhz, process.env, [guestNetArg(GUEST_NET)]),
          },
          nic: { guest: GUEST_NET, backend: net?.backend ?? { kind: "none" } },
          ...(net?.netns ? { netns: net.netns } : {}),
          // Its base image and the cached layers it boots on, read-only; a CPU quota of its vCPUs.
          jail: {
            reads: [image.dir, ...keyed.slice(0, first).map((k) => dirname(cache.layer(k.key)))],
            limits: { ...limitsFor(machine), cpus: machine.vcpus },
          },
        },
        net?.binary ? { binary: net.binary } : {},
      );
      const running = vm;
      if (req.signal?.aborted) throw new ForkdError("conflict", "the build was cancelled");
      if (capBytes !== null) {
        // QEMU reports the first write past what is left; the VM is stopped there.
        running.onDiskWriteThreshold(() => {
          over = true;
          void running.kill().catch(() => undefined);
        });
      }
      agent = await vm.connectAgent(10_000);
      await waitAgent(vm, agent, 180_000, () => deps.driver.consoleTail(runtime, 800));
      if (net && !net.linkUp) await vm.setLink(false);
      await agent.identity({
        hostname: "forkd-build",
        sandboxId: `build-${work.slice(-12)}`,
        ...(net?.linkUp ? { netUpWaitMs: 2_000 } : {}),
      });
      if (net) {
        await net.start();
        progress(`network: ${net.record().mode}, egress ${net.record().egress.mode}`, { phase: "boot" });
      }
      await armDiskCap(running);
      progress(`boot: agent ready after ${Math.round(since(t0))} ms`, { phase: "boot" });
      for (let i = first; i < keyed.length; i++) {
        const k = keyed[i] as KeyedStep;
        if (req.signal?.aborted) throw new ForkdError("conflict", "the build was cancelled");
        progress(`step ${i + 1}/${keyed.length}: ${k.what}`, { phase: "step" });
        const t = nowMs();
        await k.run(agent);
        await agent.sync();
        if (over) throw overCap();
        // Freeze the step's layer live: the VM writes on into a new empty layer over it.
        const next = own(i + 1);
        await createOverlay(next, { backing: layerOf(i), backingFormat: "qcow2", sizeBytes });
        if (running.owner) await lchown(next, running.owner.uid, running.owner.gid);
        layers.set(i + 1, next);
        await running.pause();
        await running.freezeDisk(next);
        await running.resume();
        frozen.push(i);
        await armDiskCap(running);
        progress(`step ${i + 1}/${keyed.length}: done in ${Math.round(since(t))} ms`, { phase: "step" });
      }
    } catch (err) {
      const e = req.signal?.aborted ? new ForkdError("conflict", "the build was cancelled") : err;
      if (e instanceof ForkdError && vm && !over) {
        const tail = await deps.driver.consoleTail(runtime, 1500);
        if (tail && e.code === "vmm_error") e.details.console_tail = tail;
      }
      await stop();
      // A commit that fails now does not hide the step's own error.
      await takeFrozen()
        .then(commitFrozen)
        .catch(() => undefined);
      throw over ? overCap() : e;
    }
    await stop();
    await takeFrozen();
    return await commitFrozen();
  } finally {
    await rm(runtime, { recursive: true, force: true });
  }

  /** Arms the disk cap on the VM's current top layer: what the frozen ones left of it. */
  async function armDiskCap(running: Vm): Promise<void> {
    if (capBytes === null) return;
    const { top, topNode } = await running.diskLayers();
    let left = capBytes;
    for (const i of frozen) left -= (await lstat(layerOf(i))).size;
    if (left <= (await lstat(top)).size) {
      over = true;
      throw overCap();
    }
    await running.setWriteThreshold(topNode, left);
  }

  async function stop(): Promise<void> {
    req.signal?.removeEventListener("abort", onAbort);
    agent?.close();
    if (vm) await vm.kill().catch(() => undefined);
    // Its cgroup's verdict is read and its uid freed once the process is gone.
    if (vm) await vm.released.catch(() => undefined);
    await net?.release().catch(() => undefined);
  }

  /**
   * The frozen layers, taken from the gone VM's directory into `work` (the daemon's, regular
   * files) and checked: within the disk cap, plain qcow2 layers, each rebased onto the layer
   * before it in this build's chain (the VM wrote their headers: the backing file is root's
   * choice, not theirs).
   */
  async function takeFrozen(): Promise<void> {
    let total = 0;
    for (const i of frozen) {
      const file = join(work, `step-${i}.qcow2`);
      total += await takeVmmFile(layerOf(i), file, "the build VM");
      layers.set(i, file);
      if (capBytes !== null && total > capBytes) throw overCap();
      const why = await plainLayerProblem(deps.tools, file);
      if (why !== null)
        throw new ForkdError("vmm_error", `the build VM's layer of step ${i + 1} is not plain: ${why}`);
      if (i === first) await rebaseUnsafe(deps.tools, file, parentLayer.path, parentLayer.format);
      else await rebaseUnsafe(deps.tools, file, layerOf(i - 1), "qcow2");
    }
  }

  /**
   * The frozen layers are complete: committed in order (each names its parent's final path),
   * also when a later step failed, so a fixed Dockerfile reuses them. Once a key is found taken
   * by a concurrent build, the rest stay this build's own (commit-chain.ts).
   */
  async function commitFrozen(): Promise<string> {
    const chain = frozen.map((i) => {
      const k = keyed[i] as KeyedStep;
      return { key: k.key, file: layerOf(i), info: { line: k.line, what: k.what } };
    });
    return commitChain(cache, chain, parentLayer.path, (file, backing) =>
      rebaseUnsafe(deps.tools, file, backing, "qcow2"),
    );
  }
}

/** Pings until the agent answers (the warm interpreter is not needed to build). */
async function waitAgent(
  vm: Vm,
  agent: AgentClient,
  timeoutMs: number,
  tail: () => Promise<string>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "no answer";
  while (Date.now() < deadline) {
    if (vm.exited) throw new ForkdError("vmm_error", `the build VM exited during boot: ${await tail()}`);
    try {
      await agent.ping(3_000);
      return;
    } catch (e) {
      last = errorMessage(e);
      if (agent.closed) throw new ForkdError("vmm_error", `agent connection lost during boot: ${last}`);
      await sleep(100);
    }
  }
  throw new ForkdError("timeout", `the build VM was not ready after ${timeoutMs} ms (${last})`);
}
