/**
 * The TypeScript and Python SDKs expose the same operations: every public method of each
 * client class (camelCase in TypeScript, snake_case in Python) and every error class exists in
 * both. No daemon needed: both are inspected.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import * as ts from "@forkd/sdk";
import { REPO_DIR } from "../../src/host/paths.js";

const snake = (s: string) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** Public members a class offers: prototype methods/getters, and statics prefixed "static ". */
function tsSurface(cls: { prototype: object }): string[] {
  const out = Object.getOwnPropertyNames(cls.prototype)
    .filter((n) => n !== "constructor")
    .map(snake);
  const statics = Object.getOwnPropertyNames(cls).filter((n) => !["length", "name", "prototype"].includes(n));
  return [...out, ...statics.map((n) => `static ${snake(n)}`)].sort();
}

const CLASSES = ["Sandbox", "Commands", "CommandHandle", "Files", "Controller", "Execution", "Pty"] as const;

/** What is deliberately one language's own (idiom, not surface). */
const ONLY_TS = new Set(["Execution:to_j_s_o_n"]);
const ONLY_PY = new Set(["Execution:to_json"]);

const PY = `
import inspect, json, sys
sys.path.insert(0, sys.argv[1])
import forkd
out = {}
for name in ${JSON.stringify(CLASSES)}:
    cls = getattr(forkd, name)
    members = []
    for n, v in vars(cls).items():
        if n.startswith("_"):
            continue
        if isinstance(v, (classmethod, staticmethod)):
            members.append("static " + n)
        elif n in ("kill", "set_timeout", "get_info", "connect", "pause", "get_metrics", "list_snapshots",
                   "delete_snapshot") and name == "Sandbox":
            members += [n, "static " + n]  # callable on the class and on an instance
        else:
            members.append(n)
    out[name] = sorted(members)
out["errors"] = sorted(n for n in dir(forkd) if n.endswith("Error") and inspect.isclass(getattr(forkd, n)) and issubclass(getattr(forkd, n), BaseException))
out["functions"] = sorted(n for n in dir(forkd) if inspect.isfunction(getattr(forkd, n)))
print(json.dumps(out))
`;

test("the TypeScript and Python SDKs expose the same operations", async () => {
  const { stdout } = await promisify(execFile)("python3", ["-c", PY, join(REPO_DIR, "sdk/python/src")]);
  const py = JSON.parse(stdout) as Record<string, string[]>;
  for (const name of CLASSES) {
    const t = tsSurface(ts[name] as { prototype: object }).filter((m) => !ONLY_TS.has(`${name}:${m}`));
    const p = (py[name] ?? []).filter((m) => !ONLY_PY.has(`${name}:${m}`));
    // Python constructs with Sandbox(...) as well as Sandbox.create(...): same operation.
    assert.deepEqual(p, t, `${name}: python ${JSON.stringify(p)} vs typescript ${JSON.stringify(t)}`);
  }
  const tsErrors = Object.keys(ts)
    .filter((n) => n.endsWith("Error"))
    .sort();
  assert.deepEqual(
    tsErrors.filter((n) => !(py.errors ?? []).includes(n)),
    [],
    "error classes missing in Python",
  );
  assert.deepEqual(
    (py.errors ?? []).filter((n) => !tsErrors.includes(n)),
    [],
    "error classes missing in TypeScript",
  );
  const tsFunctions = Object.entries(ts)
    .filter(([, v]) => typeof v === "function" && !/^[A-Z]/.test(v.name))
    // Functions too: camelCase in TypeScript, snake_case in Python (verifyWebhook, verify_webhook).
    .map(([n]) => snake(n))
    .sort();
  assert.deepEqual(py.functions, tsFunctions);
});
