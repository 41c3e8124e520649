/**
 * What one RUN or COPY/ADD step does in the build VM, through the guest agent: RUN as the
 * step's command with its env and cwd (created first), its output to progress line by line (at
 * most RUN_OUTPUT_LIMIT bytes a step, then one "output truncated" line) and its end kept for the
 * error of a failing step; COPY/ADD as file writes with the context's
 * modes (or --chmod), into an existing directory the destination names, then the image's own
 * chown for --chown.
 */
import { createReadStream } from "node:fs";
import { posix } from "node:path";
import type { AgentClient } from "../../agent/index.js";
import type { Progress } from "../../util/index.js";
import { ForkdError } from "../../util/index.js";
import type { CopyItem } from "./context.js";
import type { PlanStep } from "./plan.js";

const OUTPUT_TAIL = 4000;

/** Bytes of one RUN step's output forwarded to progress (1 MiB); the rest is counted, not sent. */
export const RUN_OUTPUT_LIMIT = 1 << 20;

export async function runStep(
  agent: AgentClient,
  s: Extract<PlanStep, { kind: "run" }>,
  n: number,
  timeoutMs: number,
  progress: Progress,
): Promise<void> {
  await agent.mkdir(s.cwd, { parents: true, mode: 0o755 });
  let tail = "";
  let partial = "";
  let forwarded = 0;
  let truncated = false;
  const forward = (l: string) => {
    if (truncated) return;
    forwarded += Buffer.byteLength(l) + 1;
    if (forwarded > RUN_OUTPUT_LIMIT) {
      truncated = true;
      progress(`#${n} ... output truncated (more than ${RUN_OUTPUT_LIMIT} bytes; the rest is not shown)`, {
        phase: "run",
      });
    } else progress(`#${n} ${l}`, { phase: "run" });
  };
  const onData = (d: Buffer) => {
    const text = d.toString("utf8");
    tail = (tail + text).slice(-OUTPUT_TAIL);
    if (truncated) return;
    partial += text;
    const lines = partial.split("\n");
    partial = (lines.pop() ?? "").slice(-OUTPUT_TAIL);
    for (const l of lines) forward(l);
  };
  // As USER (or the base image's config) says; with neither, the agent's default: root.
  const cmd = "exec" in s.command ? { argv: s.command.exec } : { shell: s.command.shell };
  const r = await agent.exec(
    { ...cmd, env: s.env, cwd: s.cwd, timeoutMs, ...(s.user ? { user: s.user } : {}) },
    { onStdout: onData, onStderr: onData },
  ).result;
  if (partial) forward(partial);
  if (r.exitCode !== 0) {
    const how = r.timedOut
      ? `timed out after ${timeoutMs} ms`
      : r.exitCode !== null
        ? `exit code ${r.exitCode}`
        : `signal ${r.signal}`;
    throw new ForkdError(
      "guest_error",
      `Dockerfile line ${s.line}: RUN failed (${how}): ${tail.trim().slice(-1500)}`,
      {
        line: s.line,
        exit_code: r.exitCode,
        signal: r.signal,
        timed_out: r.timedOut,
        output_tail: tail,
      },
    );
  }
}

/**
 * Docker's `COPY f /app` where /app is a directory already in the image: the file goes to
 * /app/f (a destination without a trailing "/" is otherwise the file's new name).
 */
async function intoExistingDir(
  agent: AgentClient,
  s: Extract<PlanStep, { kind: "copy" }>,
  items: CopyItem[],
): Promise<CopyItem[]> {
  const only = items[0];
  if (items.length !== 1 || !only || only.type !== "file" || !only.src || s.dest.endsWith("/")) return items;
  const isDir = await agent.stat(s.dest).then(
    (st) => st.type === "dir",
    () => false, // not there (or not statable): the destination is the file's name
  );
  return isDir ? [{ ...only, dest: posix.join(s.dest, posix.basename(only.src)) }] : items;
}

export async function copyStep(
  agent: AgentClient,
  s: Extract<PlanStep, { kind: "copy" }>,
  items: CopyItem[],
  timeoutMs: number,
): Promise<void> {
  items = await intoExistingDir(agent, s, items);
  for (const it of items) {
    const mode = s.chmod ?? it.mode;
    if (it.type === "dir") await agent.mkdir(it.dest, { parents: true, mode });
    else
      await agent.writeFile(it.dest, createReadStream(it.src ?? ""), { mode, makeParents: true, timeoutMs });
  }
  if (s.chown === null) return;
  // Names resolve in the image's own /etc/passwd and /etc/group: its chown does it.
  const paths = items.map((i) => i.dest);
  for (let i = 0; i < paths.length; i += 200) {
    const out: Buffer[] = [];
    const r = await agent.exec(
      { argv: ["chown", "-h", s.chown, "--", ...paths.slice(i, i + 200)], user: "root", timeoutMs: 120_000 },
      { onStdout: (d) => out.push(d), onStderr: (d) => out.push(d) },
    ).result;
    if (r.exitCode !== 0) {
      throw new ForkdError(
        "guest_error",
        `Dockerfile line ${s.line}: --chown=${s.chown} failed (exit ${r.exitCode}): ${Buffer.concat(out).toString().slice(-1000)}`,
        { line: s.line },
      );
    }
  }
}
