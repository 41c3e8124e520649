import assert from "node:assert/strict";
import { test } from "node:test";

import { childEnv, downloadEnv, run } from "../../src/util/proc.js";

const daemonEnv: NodeJS.ProcessEnv = {
  PATH: "/opt/x/bin:/usr/bin",
  LANG: "C.UTF-8",
  TMPDIR: "/var/tmp",
  HOME: "/root",
  FORKD_TOKEN: "admin-secret",
  FORKD_REGISTRY_PASSWORD: "registry-secret",
  FORKD_DATA_DIR: "/var/lib/forkd",
  DOCKER_CONFIG: "/root/.docker",
  AWS_SECRET_ACCESS_KEY: "cloud-secret",
  https_proxy: "http://proxy:3128",
};

test("a child's environment: PATH, locale, TMPDIR and what is asked for; nothing of forkd's", () => {
  assert.deepEqual(childEnv({}, daemonEnv), {
    PATH: "/opt/x/bin:/usr/bin",
    LANG: "C.UTF-8",
    TMPDIR: "/var/tmp",
  });
  assert.deepEqual(childEnv({ MALLOC_ARENA_MAX: "2" }, { FORKD_TOKEN: "t" }), {
    PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    MALLOC_ARENA_MAX: "2",
  });
  // Proxies only where asked (image builds), and a FORKD_ setting can never be passed on.
  assert.deepEqual(childEnv(downloadEnv(daemonEnv), daemonEnv).https_proxy, "http://proxy:3128");
  assert.equal(childEnv({}, daemonEnv).https_proxy, undefined);
  assert.throws(() => childEnv({ FORKD_TOKEN: "x" }, daemonEnv), /must not reach a child/);
  assert.throws(() => childEnv({ forkd_token: "x" }, daemonEnv), /must not reach a child/);
});

test("run() gives its program the child environment, not the daemon's", async () => {
  const saved = { ...process.env };
  try {
    process.env.FORKD_TOKEN = "admin-secret";
    process.env.FORKD_REGISTRY_PASSWORD = "registry-secret";
    process.env.DOCKER_CONFIG = "/root/.docker";
    const { stdout } = await run("env", []);
    const names = stdout
      .split("\n")
      .filter(Boolean)
      .map((l) => l.slice(0, l.indexOf("=")));
    assert.ok(names.includes("PATH"), stdout);
    assert.deepEqual(
      names.filter((n) => !["PATH", "LANG", "LC_ALL", "TZ", "TMPDIR"].includes(n)),
      [],
      `unexpected variables: ${stdout}`,
    );
    assert.doesNotMatch(stdout, /secret/);
  } finally {
    for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
    Object.assign(process.env, saved);
  }
});
