/**
 * The lines of E2B's code interpreter stream as forkd makes them (src/e2b/interpreter/messages.ts)
 * and the context ids and languages it accepts (context-ids.ts), held to what the unmodified
 * `@e2b/code-interpreter` SDK reads from them.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { EvalResult } from "../../src/agent/eval.js";
import { cellEndLines, errorLine, outputLine, resultLine } from "../../src/e2b/interpreter/messages.js";
import { e2bContextId, parseE2bContextId, runnerOf } from "../../src/e2b/interpreter/context-ids.js";
import { ForkdError } from "../../src/util/errors.js";

const base: EvalResult = {
  ok: true,
  value: null,
  value_data: null,
  display: [],
  stdout: "",
  stderr: "",
  error: null,
  context: "default",
  execution_count: 3,
};

test("stdout and stderr lines carry the text and a timestamp in Unix nanoseconds", () => {
  const at = new Date("2026-12-01T10:00:00Z");
  const line = outputLine("stdout", "hi\n", at);
  assert.deepEqual(line, { type: "stdout", text: "hi\n", timestamp: at.getTime() * 1e6 });
  assert.ok(Number.isInteger(line.timestamp));
  assert.equal(outputLine("stderr", "e").type, "stderr");
});

test("a MIME bundle becomes E2B's result fields, unknown types in extra", () => {
  const line = resultLine(
    {
      "text/plain": "<Figure>",
      "image/png": "iVBOR",
      "text/html": "<b>",
      "application/vnd.custom+json": { a: 1 },
    },
    false,
  );
  assert.deepEqual(line, {
    type: "result",
    is_main_result: false,
    text: "<Figure>",
    png: "iVBOR",
    html: "<b>",
    extra: { "application/vnd.custom+json": { a: 1 } },
  });
  for (const [mime, field] of [
    ["text/markdown", "markdown"],
    ["image/svg+xml", "svg"],
    ["image/jpeg", "jpeg"],
    ["application/pdf", "pdf"],
    ["text/latex", "latex"],
    ["application/json", "json"],
    ["application/javascript", "javascript"],
  ] as const) {
    assert.equal(resultLine({ [mime]: "x" }, true)[field], "x", mime);
  }
});

test("a cell's end: displays, then the main result, the error, the count, end_of_execution", () => {
  const lines = cellEndLines({
    ...base,
    ok: false,
    value: "42",
    value_data: { "text/html": "<i>42</i>" },
    display: [{ "image/png": "P", "text/plain": "<Figure 1>" }],
    error: { name: "ValueError", value: "v", traceback: "tb" },
  });
  assert.deepEqual(
    lines.map((l) => l.type),
    ["result", "result", "error", "number_of_executions", "end_of_execution"],
  );
  assert.equal(lines[0]?.is_main_result, false);
  assert.equal(lines[1]?.is_main_result, true);
  assert.equal(lines[1]?.text, "42");
  assert.equal(lines[1]?.html, "<i>42</i>");
  assert.deepEqual(lines[2], errorLine("ValueError", "v", "tb"));
  assert.deepEqual(lines[3], { type: "number_of_executions", execution_count: 3 });
  // a cell without a value has no main result; every line is one JSON object without newlines
  const plain = cellEndLines(base);
  assert.deepEqual(
    plain.map((l) => l.type),
    ["number_of_executions", "end_of_execution"],
  );
  for (const l of [...lines, ...plain]) assert.ok(!JSON.stringify(l).includes("\n"));
});

test("context ids name their kernel; languages map onto the kernels, others are refused", () => {
  assert.equal(e2bContextId("javascript", "0123456789abcdef"), "javascript-0123456789abcdef");
  assert.deepEqual(parseE2bContextId("python-default"), { language: "python", kernelId: "default" });
  assert.deepEqual(parseE2bContextId("javascript-0123456789abcdef"), {
    language: "javascript",
    kernelId: "0123456789abcdef",
  });
  for (const bad of ["", "python", "r-default", "python-../x", "python-0123", "default"]) {
    assert.throws(
      () => parseE2bContextId(bad),
      (e: unknown) => e instanceof ForkdError && e.code === "not_found",
      bad,
    );
  }
  assert.equal(runnerOf(undefined), "python");
  assert.equal(runnerOf("Python"), "python");
  assert.equal(runnerOf("js"), "javascript");
  assert.equal(runnerOf("javascript"), "javascript");
  assert.equal(runnerOf("bash"), "bash");
  for (const l of ["r", "java", "typescript", "deno"]) {
    assert.throws(
      () => runnerOf(l),
      (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument",
      l,
    );
  }
});
