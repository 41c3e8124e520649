/**
 * The Dockerfile step cache's keys (step-cache.ts). Each step's key is sha256 over its parent's
 * key and the step (normalised; a COPY or ADD with the files it copies), the last one's over the
 * image config; the first parent is the build's cache scope and its base image. The scope is the
 * build's owner: a tenant's builds only ever find that tenant's layers, and the admins' builds
 * only the admins' (docs/images.md), so no build's "cached" answers anything about another's.
 */
import { createHash } from "node:crypto";
import type { ImageConfig, Plan } from "./plan.js";

const sha = (...parts: string[]): string => {
  const h = createHash("sha256");
  for (const p of parts) h.update(p).update("\n");
  return h.digest("hex");
};

/**
 * The cache scope of a build by `owner` (a tenant; null: an admin). Tenant names cannot hold
 * ":" (access/tokens.ts TENANT_RE), so no tenant's scope is the admins'.
 */
export const cacheScope = (owner: string | null): string => (owner === null ? "admin" : `tenant:${owner}`);

export interface StepKeys {
  /** One key per step of the plan, in order. */
  steps: string[];
  /** The key of the last step, writing the image config (the image's build hash). */
  final: string;
}

/**
 * The keys of `plan`'s steps for a build by `owner` on the base image whose content address is
 * `baseContent`; `copied(i)` is the hash of the files step `i` (a COPY or ADD) copies.
 */
export function stepKeys(
  owner: string | null,
  baseContent: string,
  plan: Plan,
  copied: (i: number) => string,
): StepKeys {
  let parent = sha("forkd-dockerfile-base/2", cacheScope(owner), baseContent);
  const steps: string[] = [];
  for (const [i, s] of plan.steps.entries()) {
    const norm =
      s.kind === "run"
        ? JSON.stringify({
            kind: "run",
            command: s.command,
            env: Object.entries(s.env).sort(([a], [b]) => (a < b ? -1 : 1)),
            cwd: s.cwd,
            user: s.user,
          })
        : JSON.stringify({ kind: "copy", dest: s.dest, chown: s.chown, chmod: s.chmod, files: copied(i) });
    parent = sha("step", parent, norm);
    steps.push(parent);
  }
  return { steps, final: configKey(parent, plan.config) };
}

const configKey = (parent: string, config: ImageConfig): string =>
  sha("config", parent, JSON.stringify(config));
