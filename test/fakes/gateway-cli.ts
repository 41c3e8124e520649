/**
 * A stand-in for `forkd gateway` to the contract src/localcluster starts a gateway with (until
 * the real one exists): run as `node gateway-cli.js gateway`, it refuses to start without
 * FORKD_CLUSTER or a readable FORKD_CLUSTER_SECRET_FILE of at least 32 bytes, and serves GET
 * /v1/health on FORKD_GATEWAY_LISTEN and FORKD_GATEWAY_E2B_LISTEN to the bearer of FORKD_TOKEN.
 */
import { readFileSync } from "node:fs";
import { createServer } from "node:http";

function main(): void {
  const env = process.env;
  if (process.argv[2] !== "gateway") return fail(`unknown command '${process.argv[2] ?? ""}'`);
  if (!env.FORKD_CLUSTER?.startsWith("etcd://")) return fail("FORKD_CLUSTER is not set");
  const secret = env.FORKD_CLUSTER_SECRET_FILE
    ? readFileSync(env.FORKD_CLUSTER_SECRET_FILE)
    : Buffer.alloc(0);
  if (secret.length < 32) return fail("FORKD_CLUSTER_SECRET_FILE holds fewer than 32 bytes");
  for (const name of ["FORKD_GATEWAY_LISTEN", "FORKD_GATEWAY_E2B_LISTEN"]) {
    const m = /^(.+):(\d+)$/.exec(env[name] ?? "");
    if (!m?.[1] || !m[2]) return fail(`${name} must be HOST:PORT`);
    createServer((req, res) => {
      const ok = req.url === "/v1/health" && req.headers.authorization === `Bearer ${env.FORKD_TOKEN ?? ""}`;
      res.writeHead(ok ? 200 : 401, { "content-type": "application/json" }).end(JSON.stringify({ ok }));
    }).listen(Number(m[2]), m[1]);
  }
}

function fail(why: string): void {
  process.stderr.write(`error: ${why}\n`);
  process.exitCode = 2;
}

main();
