/**
 * Making a pre-started VMM hot: restored from its snapshot (restoreChild), resumed, and put
 * through the paths a child's first requests take (IDENTITY, an exec, a shell exec and, with
 * warm kernels, a cell in a throwaway code context of each: warm-cells.ts), so TCG has translated them before
 * a fork takes it; then stopped again (QMP stop: an idle hot member costs no CPU). The fork that
 * takes it continues it and sends the child's real identity, which reseeds the kernel RNG and
 * the kernels' generators, sets the clock, hostname and sandbox id (fork.ts). Nothing the
 * warm-up ran is left for the user: no files (the commands write none), no history (no
 * interactive shell), the context is deleted (the default one's globals and count are untouched).
 */
import type { AgentClient } from "../agent/index.js";
import type { EvalLanguage } from "../agent/index.js";
import type { Snapshot } from "../snapshot/index.js";
import { ForkdError } from "../util/index.js";
import type { SandboxContext } from "./context.js";
import { readSmapsRollup } from "../metrics/index.js";
import { discard } from "./pool.js";
import type { Prepared } from "./pool.js";
import { prepare } from "./prepare.js";
import { restoreChild } from "./restore.js";
import { WARM_CELLS } from "./warm-cells.js";

/** Each step of a warm-up has this long (under TCG a first exec is ~0.3 s; a loaded host is slower). */
export const WARM_STEP_MS = 30_000;
/** Identity values a warm-up uses: never a child's (a child's id is a sandbox id). */
export const WARM_HOSTNAME = "forkd-pool-warmup";

/** Fails the warm-up: what the member did instead. */
function expect(ok: boolean, what: string): void {
  if (!ok) throw new ForkdError("internal", `pool warm-up: ${what}`);
}

/** One command to completion, its output dropped; it must exit 0. */
async function run(agent: AgentClient, req: { argv?: string[]; shell?: string }): Promise<void> {
  const h = agent.exec({ ...req, timeoutMs: WARM_STEP_MS, startTimeoutMs: WARM_STEP_MS, internal: true });
  const r = await h.result;
  expect(r.exitCode === 0, `${req.argv?.join(" ") ?? req.shell ?? "?"} exited ${r.exitCode ?? r.signal}`);
}

/** A cell in a context of its own, which is deleted after it. */
async function cell(agent: AgentClient, language: EvalLanguage): Promise<void> {
  const [ctxt] = await agent.contexts(language, { op: "create" });
  expect(ctxt !== undefined, `${language} kernel made no context`);
  const id = ctxt!.id;
  try {
    const r = await agent.eval(WARM_CELLS[language](id), WARM_STEP_MS, language, { context: id });
    expect(r.ok && r.value === "42", `${language} cell: ${r.error?.value ?? r.value ?? "no value"}`);
  } finally {
    await agent.contexts(language, { op: "delete", context: id });
  }
}

/**
 * Restores `p` from `snap`, runs the warm-up, and stops it. Throws when a step fails (the
 * caller discards the member); every step has a timeout.
 */
export async function warmUp(ctx: SandboxContext, p: Prepared, snap: Snapshot): Promise<void> {
  await restoreChild(ctx, p.vm, snap);
  // A pooled child has no network: its link is down whatever the snapshot saved.
  if (snap.meta.nic?.linkUp) await p.vm.setLink(false);
  await p.vm.resume();
  const agent = p.agent;
  await agent.identity({ hostname: WARM_HOSTNAME, sandboxId: `${WARM_HOSTNAME}-${p.id}` }, WARM_STEP_MS);
  await run(agent, { argv: ["true"] });
  await run(agent, { shell: "true" });
  const ping = await agent.ping(WARM_STEP_MS);
  if (ping.evalReady) {
    for (const language of ping.kernels ?? ["python"]) {
      if (language === "python" || language === "javascript") await cell(agent, language);
    }
  }
  // A second exec after the cells: the first request after a stop takes this path too.
  await run(agent, { argv: ["true"] });
  await p.vm.pause();
}

/**
 * A pool member of snapshot `tag`: started (prepare.ts) and, when `hot`, warmed (a member whose
 * warm-up fails is discarded and the error thrown: the pool logs it and does not retry it hot).
 * Its memory is measured for the pool's memory bound.
 */
export async function poolMember(ctx: SandboxContext, tag: string, hot: boolean): Promise<Prepared> {
  const snap = await ctx.store.get(tag);
  const p = await prepare(ctx, snap);
  if (hot) {
    try {
      await warmUp(ctx, p, snap);
    } catch (e) {
      await discard(p);
      throw e;
    }
  }
  const mem = await readSmapsRollup(p.vm.pid);
  return { ...p, hot, ...(mem ? { memMiB: mem.pss / 2 ** 20 } : {}) };
}
