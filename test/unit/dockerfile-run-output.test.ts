/**
 * A RUN step's output (a fake agent, no VM): forwarded to progress line by line up to
 * RUN_OUTPUT_LIMIT bytes, then one "output truncated" line and nothing more, while the failing
 * step's error still carries the output's last bytes; COPY of one file to a directory already in
 * the image writes into it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { AgentClient } from "../../src/agent/client.js";
import { RUN_OUTPUT_LIMIT, copyStep, runStep } from "../../src/image/dockerfile/steps.js";
import type { PlanStep } from "../../src/image/dockerfile/plan.js";

/** An agent whose exec writes `chunks` to stdout, then exits with `code`. */
function fakeAgent(chunks: Buffer[], code: number): AgentClient {
  return {
    mkdir: () => Promise.resolve(),
    exec: (_req: unknown, h: { onStdout?: (d: Buffer) => void }) => ({
      result: (async () => {
        for (const c of chunks) h.onStdout?.(c);
        return { exitCode: code, signal: null, timedOut: false };
      })(),
    }),
  } as unknown as AgentClient;
}

const step: Extract<PlanStep, { kind: "run" }> = {
  kind: "run",
  line: 4,
  command: { shell: "yes" },
  env: {},
  cwd: "/",
  user: null,
};

test("RUN output: at most RUN_OUTPUT_LIMIT bytes forwarded, then one truncation line", async () => {
  const line = `${"y".repeat(99)}\n`;
  const chunk = Buffer.from(line.repeat(1000)); // 100 KB
  const chunks = Array.from({ length: 100 }, () => chunk); // 10 MB in all
  const got: string[] = [];
  await assert.rejects(
    runStep(fakeAgent([...chunks, Buffer.from("the end\n")], 1), step, 2, 1000, (m) => got.push(m)),
    (e: Error & { details?: { output_tail?: string } }) => {
      assert.match(e.message, /line 4: RUN failed \(exit code 1\)/);
      assert.match(e.details?.output_tail ?? "", /the end\n$/);
      return true;
    },
  );
  // The output's bytes forwarded (each message is "#2 " and a line, without its newline).
  const shown = got.filter((m) => !/output truncated/.test(m));
  const bytes = shown.reduce((a, m) => a + Buffer.byteLength(m) - 3 + 1, 0);
  assert.ok(bytes <= RUN_OUTPUT_LIMIT && bytes > RUN_OUTPUT_LIMIT - 200, String(bytes));
  assert.equal(got.filter((m) => /output truncated/.test(m)).length, 1);
  assert.match(got[got.length - 1] ?? "", /^#2 \.\.\. output truncated/);
  assert.equal(got[0], `#2 ${"y".repeat(99)}`);
  // Short output is forwarded whole, the last line without its newline too.
  const short: string[] = [];
  await runStep(fakeAgent([Buffer.from("a\nb\nc")], 0), step, 3, 1000, (m) => short.push(m));
  assert.deepEqual(short, ["#3 a", "#3 b", "#3 c"]);
});

test("COPY f /app where /app is a directory in the image writes /app/f", async () => {
  const written: string[] = [];
  const agent = (dirs: string[]) =>
    ({
      stat: (p: string) =>
        dirs.includes(p) ? Promise.resolve({ type: "dir" }) : Promise.reject(new Error("no such file")),
      mkdir: () => Promise.resolve(),
      writeFile: (p: string, data: NodeJS.ReadableStream & { destroy(): void }) => {
        data.on("error", () => undefined); // the context file is not there: never read
        data.destroy();
        written.push(p);
        return Promise.resolve(0);
      },
    }) as unknown as AgentClient;
  const copy = (dest: string): Extract<PlanStep, { kind: "copy" }> => ({
    kind: "copy",
    line: 5,
    add: false,
    sources: ["f"],
    dest,
    chown: null,
    chmod: null,
  });
  const item = (dest: string) => [{ src: "/ctx/sub/f", dest, type: "file" as const, mode: 0o644, size: 1 }];
  await copyStep(agent(["/app"]), copy("/app"), item("/app"), 1000);
  await copyStep(agent([]), copy("/new"), item("/new"), 1000);
  await copyStep(agent(["/app"]), copy("/app/"), item("/app/f"), 1000);
  assert.deepEqual(written, ["/app/f", "/new", "/app/f"]);
});
