/**
 * A snapshot from a Dockerfile: the build context (a tar stream) unpacked into the step cache's
 * working area, the Dockerfile read from it, the image built step by step
 * (image/dockerfile/build.ts), then snapshotted by create.ts like a template's image. The tag is
 * refused before anything is built if it is taken.
 *
 * FROM: `forkd://NAME` is forkd's template NAME (its guest image as the base, no config); any
 * other reference is pulled (the daemon's image puller) and its guest image built, as
 * `POST /v1/snapshots {image}` does.
 */
import { readFile, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { ImageBuilder } from "../image/index.js";
import { buildDockerfile } from "../image/index.js";
import type { BaseImage, BuildNetwork, DockerfileBuildResult, FromResolver } from "../image/index.js";
import { unpackContext } from "../image/index.js";
import { cleanRelative } from "../image/index.js";
import { DOCKERFILE_LIMITS } from "../image/index.js";
import { EMPTY_CONFIG } from "../image/index.js";
import { StepCache } from "../image/index.js";
import { envMap } from "../image/index.js";
import type { EvalLanguage } from "../agent/index.js";
import { ForkdError } from "../util/index.js";
import { GUEST_NET } from "../net/index.js";
import type { NetworkSpec } from "../net/index.js";
import type { NetworkService } from "../net/index.js";
import { nicMeta } from "./meta.js";
import type { SnapshotDeps } from "./create.js";
import type { NewSnapshotRequest } from "./create.js";
import type { SnapshotMeta } from "./meta.js";
import type { Progress } from "../util/index.js";

export const TEMPLATE_SCHEME = "forkd://";

export interface DockerfileSnapshotRequest {
  tag: string;
  /** The Dockerfile's path inside the context (default "Dockerfile"). */
  dockerfile: string;
  buildArgs: Record<string, string>;
  memoryMiB: number;
  vcpus: number;
  warm: string | null;
  warmEval: string | null;
  /** The kernel warmEval runs in. */
  warmEvalLanguage: EvalLanguage;
  owner: string | null;
  /** Aborted: the build and the snapshot are cancelled (create.ts CreateSnapshotRequest.signal). */
  signal?: AbortSignal;
  /** What the build's step layers may hold together (the tenant's cap), MiB; null: no cap. */
  maxDiskMiB: number | null;
}

/** FROM forkd://NAME: the template's image; anything else: `images` (OCI), if there is one. */
export function defaultResolver(builder: ImageBuilder, images?: FromResolver): FromResolver {
  return async (ref, progress, signal) => {
    if (ref.startsWith(TEMPLATE_SCHEME)) {
      const name = ref.slice(TEMPLATE_SCHEME.length);
      await builder.assertKnown(name);
      const image = await builder.ensure(name, (line) => progress(line, { phase: "image" }));
      const base: BaseImage = { image, config: EMPTY_CONFIG, source: { kind: "template", name } };
      return base;
    }
    if (images) return images(ref, progress, signal);
    throw new ForkdError(
      "unavailable",
      `FROM ${ref}: this daemon cannot pull images yet; use FROM ${TEMPLATE_SCHEME}<template> (e.g. ${TEMPLATE_SCHEME}python)`,
      { ref },
    );
  };
}

/** What a build VM's network is: a sandbox's in a netns slot with egress allowed (the host's rules apply). */
export const BUILD_NETWORK: NetworkSpec = {
  mode: "netns",
  egress: { mode: "allow", allow: [], dns: true },
  expose: [],
};

/** Build networks from the sandboxes' network service (refused where it has no slots). */
export const buildNetworkOf =
  (net: NetworkService): BuildNetwork =>
  () =>
    net.attach(BUILD_NETWORK, nicMeta(GUEST_NET, true));

export interface DockerfileSnapshotDeps {
  create: SnapshotDeps;
  cacheDir: string;
  resolve: FromResolver;
  network?: BuildNetwork;
  /** Pins a cache entry the build uses until the snapshot is made (false: collected). */
  pin?: (path: string) => Promise<boolean>;
  /** Creates the snapshot from the built image (SnapshotService.create: logs, prewarm). */
  snapshot: (req: NewSnapshotRequest, progress: Progress) => Promise<SnapshotMeta>;
}

export async function createFromDockerfile(
  deps: DockerfileSnapshotDeps,
  req: DockerfileSnapshotRequest,
  context: AsyncIterable<Uint8Array>,
  progress: Progress = () => undefined,
): Promise<{ meta: SnapshotMeta; build: DockerfileBuildResult }> {
  if (await deps.create.store.has(req.tag)) {
    throw new ForkdError("conflict", `snapshot ${req.tag} already exists`, { tag: req.tag });
  }
  const cache = new StepCache(deps.cacheDir);
  const work = await cache.workDir();
  try {
    const dir = join(work, "context");
    progress("context: receiving the build context", { phase: "context" });
    await unpackContext(context, dir);
    const rel = cleanRelative(req.dockerfile);
    if (rel === "" || req.dockerfile.split("/").includes("..")) {
      throw new ForkdError(
        "invalid_argument",
        `dockerfile ${JSON.stringify(req.dockerfile)}: not a path in the context`,
      );
    }
    const file = join(dir, rel);
    const st = await stat(file).catch(() => null);
    if (!st?.isFile()) {
      throw new ForkdError(
        "invalid_argument",
        `the build context has no Dockerfile at ${JSON.stringify(rel)}`,
      );
    }
    if (st.size > DOCKERFILE_LIMITS.bytes) {
      throw new ForkdError(
        "invalid_argument",
        `the Dockerfile is larger than ${DOCKERFILE_LIMITS.bytes} bytes`,
      );
    }
    const build = await buildDockerfile(
      {
        cacheDir: deps.cacheDir,
        driver: deps.create.driver,
        accel: deps.create.accel,
        runDir: deps.create.runDir,
        resolve: deps.resolve,
        tools: deps.create.tools,
        ...(deps.network ? { network: deps.network } : {}),
        ...(deps.pin ? { pin: deps.pin } : {}),
      },
      {
        dockerfile: await readFile(file, "utf8"),
        contextDir: dir,
        buildArgs: req.buildArgs,
        memoryMiB: req.memoryMiB,
        vcpus: req.vcpus,
        ...(req.signal ? { signal: req.signal } : {}),
        owner: req.owner,
        maxDiskMiB: req.maxDiskMiB,
      },
      progress,
    );
    const meta = await deps.snapshot(
      {
        tag: req.tag,
        from: {
          prepared: {
            image: build.image,
            source: { kind: "dockerfile", from: build.from.ref, base: build.from.source, key: build.key },
            execDefaults: {
              env: envMap(build.config.env),
              ...(build.config.workingDir ? { cwd: build.config.workingDir } : {}),
            },
          },
        },
        warm: req.warm,
        warmEval: req.warmEval,
        warmEvalLanguage: req.warmEvalLanguage,
        memoryMiB: req.memoryMiB,
        vcpus: req.vcpus,
        owner: req.owner,
        ...(req.signal ? { signal: req.signal } : {}),
      },
      progress,
    );
    return { meta, build };
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}
