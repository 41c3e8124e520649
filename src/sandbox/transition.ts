/**
 * A sandbox's transitions (a branch, a pause, a resume) run one at a time: each drives its VMM
 * over QMP. A kill() meanwhile marks the sandbox doomed; the transition's end retires it.
 */
import { ForkdError } from "../util/index.js";
import { retire } from "./retire.js";
import type { Sandbox } from "./sandbox.js";

const DOING = { branch: "branched", pause: "paused", resume: "resumed" } as const;

/** Refuses `s` while a transition of it is in progress (a conflict saying which). */
export function notInTransition(s: Sandbox): void {
  if (s.transition)
    throw new ForkdError("conflict", `sandbox ${s.record.id} is being ${DOING[s.transition]} already`, {
      id: s.record.id,
    });
}

/**
 * Runs a branch, pause or resume of `s` (one at a time). A kill() while it runs marks `s`
 * doomed: it is retired as soon as the transition ends, whatever the outcome.
 */
export async function transit<T>(
  s: Sandbox,
  kind: "branch" | "pause" | "resume",
  fn: () => Promise<T>,
): Promise<T> {
  notInTransition(s);
  s.transition = kind;
  let settle = () => undefined as void;
  s.settling = new Promise<void>((r) => (settle = r));
  try {
    return await fn();
  } finally {
    s.transition = null;
    // Retired before kill() is released: its reply comes once the files are gone.
    if (s.doomed !== null) await retire(s, s.doomed, true).catch(() => undefined);
    s.settling = null;
    settle();
  }
}
