/**
 * `forkd snapshot --tag T --dockerfile PATH`: the Dockerfile's folder sent as the build context
 * (build-context.ts) to POST /v1/snapshots/build through the SDK, its progress drawn (each step,
 * and each RUN's output lines).
 */
import { dirname, relative, resolve } from "node:path";
import type { ApiClient, Wire } from "@forkd/sdk";
import type { CliContext } from "./context.js";
import { usageError } from "./errors.js";
import { contextPaths, contextTar } from "./build-context.js";
import { interruptible } from "./interrupt.js";
import { ProgressView } from "./progress.js";
import { PROGRESS_IDLE_MS } from "./timeouts.js";

/** `warm_eval_language`, sent only when not python (so a daemon from before the field takes Python warm-ups). */
export function warmEvalLanguage(l: "python" | "javascript" | undefined): {
  warm_eval_language?: "javascript";
} {
  return l === "javascript" ? { warm_eval_language: l } : {};
}

export async function snapshotFromDockerfile(
  api: ApiClient,
  o: {
    tag: string;
    dockerfile: string;
    buildArg?: string[];
    warm?: string;
    warmEval?: string;
    warmEvalLanguage?: "python" | "javascript";
    memory: number;
    vcpus: number;
  },
  ctx: Pick<CliContext, "say" | "progressOut">,
): Promise<Wire["Snapshot"]> {
  const file = resolve(o.dockerfile);
  const dir = dirname(file);
  const args: Record<string, string> = {};
  for (const a of o.buildArg ?? []) {
    const eq = a.indexOf("=");
    if (eq <= 0) throw usageError(`--build-arg ${a}: expected name=value`);
    args[a.slice(0, eq)] = a.slice(eq + 1);
  }
  const paths = await contextPaths(dir, file);
  ctx.say(`forkd: building snapshot ${o.tag} from ${o.dockerfile} (context ${dir}: ${paths.length} entries)`);
  const tar = contextTar(dir, paths);
  const view = new ProgressView(ctx.progressOut);
  try {
    const [m] = await Promise.all([
      interruptible("the build stops in the daemon (finished steps stay cached)", (signal) =>
        api.buildSnapshot(
          {
            tag: o.tag,
            dockerfile: relative(dir, file),
            ...(Object.keys(args).length > 0 ? { build_args: args } : {}),
            ...(o.warm !== undefined ? { warm: o.warm } : {}),
            ...(o.warmEval !== undefined ? { warm_eval: o.warmEval } : {}),
            ...warmEvalLanguage(o.warmEvalLanguage),
            memory_mib: o.memory,
            vcpus: o.vcpus,
          },
          tar.stream,
          { timeoutMs: PROGRESS_IDLE_MS, signal, onProgress: (ev) => view.event(ev) },
        ),
      ),
      tar.done,
    ]);
    return m;
  } finally {
    view.end();
    tar.stream.destroy();
  }
}
