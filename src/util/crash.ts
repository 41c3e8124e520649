/**
 * Test-only fault injection: named points in multi-step operations (create, branch, pause,
 * resume, fork, pack, unpack) where a daemon started with FORKD_TEST_CRASH_AT=<point> SIGKILLs itself,
 * so crash-recovery tests hit each step deterministically. Read once by the entry point and
 * injected; with the variable unset every point is a no-op. Never set it in production.
 */

/** Called at each named point of an operation (see CRASH_POINTS). */
export type CrashPoint = (point: CrashPointName) => void;

/** Every point an operation passes, in its order. */
export const CRASH_POINTS = [
  "create:booted",
  "create:before-publish",
  "fork:before-record",
  "fork:after-record",
  "branch:live-stopped",
  "branch:paused",
  "branch:before-publish",
  "pause:saved",
  "pause:recorded",
  "pause:after-stop",
  "pause:before-record",
  "resume:launched",
  "resume:recorded",
  "pack:streaming",
  "unpack:extracted",
  "unpack:before-publish",
] as const;

export type CrashPointName = (typeof CRASH_POINTS)[number];

export const NO_CRASH: CrashPoint = () => undefined;

/** The crash point FORKD_TEST_CRASH_AT names (unset: none; an unknown name is an error). */
export function crashPointFromEnv(env: NodeJS.ProcessEnv): CrashPoint {
  const at = env.FORKD_TEST_CRASH_AT;
  if (!at) return NO_CRASH;
  if (!(CRASH_POINTS as readonly string[]).includes(at))
    throw new Error(
      `FORKD_TEST_CRASH_AT: unknown point ${JSON.stringify(at)} (one of ${CRASH_POINTS.join(", ")})`,
    );
  return (point) => {
    if (point !== at) return;
    process.stderr.write(`${JSON.stringify({ level: "warn", msg: "test crash point reached", point })}\n`);
    // A signal a process sends itself is delivered before kill() returns: nothing after this runs.
    process.kill(process.pid, "SIGKILL");
  };
}
