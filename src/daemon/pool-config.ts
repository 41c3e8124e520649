/**
 * The warm pool's settings, read from the environment (docs/operations.md "The warm pool"):
 * FORKD_POOL_SIZE (per snapshot), FORKD_POOL_MAX (host-wide count), FORKD_POOL_MAX_MIB (host-wide
 * memory), FORKD_POOL_HOT (hot members), FORKD_POOL_IDLE_S (a snapshot not forked for this long
 * loses its members). A bad value stops the daemon with a clear message.
 */
import { poolDefaults } from "../sandbox/index.js";
import type { PoolOptions } from "../sandbox/index.js";
import { ForkdError } from "../util/index.js";

function count(env: NodeJS.ProcessEnv, name: string, dflt: number, max: number): number {
  const v = env[name];
  if (v === undefined || v === "") return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0 || n > max) {
    throw new ForkdError(
      "invalid_argument",
      `${name} must be an integer in 0..${max}, not ${JSON.stringify(v)}`,
    );
  }
  return n;
}

function flag(env: NodeJS.ProcessEnv, name: string, dflt: boolean): boolean {
  const v = env[name];
  if (v === undefined || v === "") return dflt;
  if (["1", "on", "true", "yes"].includes(v)) return true;
  if (["0", "off", "false", "no"].includes(v)) return false;
  throw new ForkdError("invalid_argument", `${name} must be on or off, not ${JSON.stringify(v)}`);
}

export function poolConfig(env: NodeJS.ProcessEnv): PoolOptions {
  const d = poolDefaults();
  const maxMiB = count(env, "FORKD_POOL_MAX_MIB", 0, 1 << 24);
  return {
    ...d,
    perTag: count(env, "FORKD_POOL_SIZE", d.perTag, 64),
    max: count(env, "FORKD_POOL_MAX", d.max, 1024),
    ...(maxMiB > 0 ? { maxMiB } : {}),
    hot: flag(env, "FORKD_POOL_HOT", d.hot),
    idleMs: count(env, "FORKD_POOL_IDLE_S", d.idleMs / 1000, 7 * 86_400) * 1000,
  };
}
