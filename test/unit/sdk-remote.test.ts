/**
 * Both SDKs reach a daemon over TCP with a bearer token (FORKD_URL + FORKD_TOKEN, or options),
 * and a missing or wrong token is an AuthenticationError; an unreachable daemon is a
 * ConnectionError. The API runs here without VMs.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  AuthenticationError,
  ConnectionError,
  Controller,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
} from "@forkd/sdk";
import { REPO_DIR } from "../../src/host/paths.js";
import { testServices } from "../helpers/services.js";

const TOKEN = "s".repeat(24) + "0123456789abcdef";
let url = "";
let cleanup: () => Promise<void>;

before(async () => {
  const t = await testServices();
  cleanup = t.cleanup;
  url = await t.serveTcp(TOKEN);
});

after(async () => {
  await cleanup();
});

test("TypeScript SDK: URL + token works; no token or a wrong one is AuthenticationError", async () => {
  const ok = new Controller({ url, token: TOKEN });
  assert.equal((await ok.version()).api, "v1");
  assert.deepEqual(await ok.listSnapshots(), []);
  await assert.rejects(Sandbox.connect("sb-aaaaaaaaaaaaaaaa", { url, token: TOKEN }), NotFoundError);
  await assert.rejects(new Controller({ url, token: "" }).version(), AuthenticationError);
  await assert.rejects(new Controller({ url, token: TOKEN + "x" }).listSnapshots(), AuthenticationError);
  // E2B's option name works too.
  assert.equal((await new Controller({ url, apiKey: TOKEN }).version()).api, "v1");
  await assert.rejects(new Controller({ url: "http://127.0.0.1:9" }).health(), ConnectionError);
});

const PY = `
import sys
sys.path.insert(0, sys.argv[1])
import forkd
url, token = sys.argv[2], sys.argv[3]
assert forkd.Controller(url=url, token=token).version()["api"] == "v1"
try:
    forkd.Sandbox.connect("sb-aaaaaaaaaaaaaaaa", url=url, token=token)
    raise SystemExit("no NotFoundError")
except forkd.NotFoundError:
    pass
for bad in ("", token + "x"):
    try:
        forkd.Controller(url=url, token=bad).list_snapshots()
        raise SystemExit("no AuthenticationError for %r" % bad)
    except forkd.AuthenticationError:
        pass
try:
    forkd.Controller(url="http://127.0.0.1:9").health()
    raise SystemExit("no ConnectionError")
except forkd.ConnectionError:
    pass
print("ok")
`;

test("Python SDK: URL + token works; no token or a wrong one is AuthenticationError", async () => {
  const env = { ...process.env, FORKD_TOKEN: "", FORKD_URL: "" };
  const { stdout } = await promisify(execFile)(
    "python3",
    ["-c", PY, join(REPO_DIR, "sdk", "python", "src"), url, TOKEN],
    { env },
  );
  assert.equal(stdout.trim(), "ok");
});

// warm_eval_language reaches the daemon from both SDKs: a language that is no kernel comes back
// as the daemon's 400 naming the field (a client that dropped it would start a creation).
const PY_WARM = `
import sys
sys.path.insert(0, sys.argv[1])
import forkd
try:
    forkd.Controller(url=sys.argv[2], token=sys.argv[3]).create_snapshot(
        "wl", warm_eval="1", warm_eval_language="ruby")
    raise SystemExit("no InvalidArgumentError")
except forkd.InvalidArgumentError as e:
    print("warm_eval_language" in str(e))
`;

test("both SDKs send warm_eval_language (a language that is no kernel is the daemon's 400)", async () => {
  await assert.rejects(
    new Controller({ url, token: TOKEN }).createSnapshot({
      tag: "wl",
      warmEval: "1",
      warmEvalLanguage: "ruby" as "javascript",
    }),
    (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.match((e as Error).message, /warm_eval_language/);
      return true;
    },
  );
  const env = { ...process.env, FORKD_TOKEN: "", FORKD_URL: "" };
  const { stdout } = await promisify(execFile)(
    "python3",
    ["-c", PY_WARM, join(REPO_DIR, "sdk", "python", "src"), url, TOKEN],
    { env },
  );
  assert.equal(stdout.trim(), "True");
});
