/**
 * envd round trip: one command through E2B's envd protocol (the npm `e2b` SDK's commands.run,
 * Connect server stream over the E2B listener) against the same command through forkd's own
 * REST API (POST /v1/sandboxes/:id/exec on the unix socket), in the same sandbox, interleaved,
 * measured in this one run; and REST's `/bin/sh -c true`, to show what the SDK's login shell
 * (`/bin/bash -l -c`) costs by itself. Prints p50/p90 of each and the ratio, and JSON.
 *
 *   node dist/bench/e2b-envd.js [--samples 30] [--json-out FILE]
 */
import { writeFile } from "node:fs/promises";
import { parseArgs } from "node:util";
import { Sandbox } from "e2b";
import { apiRequest } from "../test/helpers/http.js";
import { startE2bDaemon } from "../test/helpers/e2b.js";

const { values: args } = parseArgs({
  options: { samples: { type: "string", default: "30" }, "json-out": { type: "string" } },
});
const SAMPLES = Number(args.samples);

const pct = (xs: number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
};

const e = await startE2bDaemon();
Object.assign(process.env, e.env);
let failed = true;
try {
  const sbx = await Sandbox.create(e.template, { timeoutMs: 900_000, requestTimeoutMs: 300_000 });
  // The SDK runs `/bin/bash -l -c CMD` as `user`; the REST call runs exactly that too.
  const viaEnvd = async () => {
    const t0 = performance.now();
    await sbx.commands.run("true");
    return performance.now() - t0;
  };
  const viaRest = async () => {
    const t0 = performance.now();
    await apiRequest(e.daemon.ep, "POST", `/v1/sandboxes/${sbx.sandboxId}/exec`, {
      cmd: ["/bin/bash", "-l", "-c", "true"],
      user: "user",
      cwd: "/home/user",
    });
    return performance.now() - t0;
  };
  // What the login shell costs by itself: REST's own default, `/bin/sh -c true`.
  const viaRestSh = async () => {
    const t0 = performance.now();
    await apiRequest(e.daemon.ep, "POST", `/v1/sandboxes/${sbx.sandboxId}/exec`, {
      cmd: "true",
      user: "user",
      cwd: "/home/user",
    });
    return performance.now() - t0;
  };
  for (let i = 0; i < 3; i++) {
    await viaEnvd(); // warm up every path (the SDK's connection, the account cache)
    await viaRest();
    await viaRestSh();
  }
  const envd: number[] = [];
  const rest: number[] = [];
  const restSh: number[] = [];
  for (let i = 0; i < SAMPLES; i++) {
    if (i % 2 === 0) {
      envd.push(await viaEnvd());
      rest.push(await viaRest());
      restSh.push(await viaRestSh());
    } else {
      restSh.push(await viaRestSh());
      rest.push(await viaRest());
      envd.push(await viaEnvd());
    }
  }
  const result = {
    samples: SAMPLES,
    envd_ms: { p50: pct(envd, 50), p90: pct(envd, 90) },
    rest_ms: { p50: pct(rest, 50), p90: pct(rest, 90) },
    rest_sh_ms: { p50: pct(restSh, 50), p90: pct(restSh, 90) },
    ratio_p50: pct(envd, 50) / pct(rest, 50),
  };
  console.log(`command round trip (${SAMPLES} each, interleaved)`);
  console.log(
    `  envd (E2B SDK)  p50 ${result.envd_ms.p50.toFixed(1)} ms  p90 ${result.envd_ms.p90.toFixed(1)} ms`,
  );
  console.log(
    `  forkd REST      p50 ${result.rest_ms.p50.toFixed(1)} ms  p90 ${result.rest_ms.p90.toFixed(1)} ms`,
  );
  console.log(
    `  REST, sh -c     p50 ${result.rest_sh_ms.p50.toFixed(1)} ms  p90 ${result.rest_sh_ms.p90.toFixed(1)} ms`,
  );
  console.log(`  ratio p50       ${result.ratio_p50.toFixed(2)}x (same command)`);
  console.log(JSON.stringify(result));
  if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(result, null, 2) + "\n");
  await sbx.kill();
  failed = false;
} finally {
  await e.daemon.destroy(failed);
}
