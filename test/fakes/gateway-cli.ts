/**
 * A stand-in for `forkd gateway` in test/unit/localcluster.test.ts's test of a gateway's process
 * (started to its contract, found by the cluster's marker, killed, restarted, removed by
 * `down`). It remains because the real gateway connects to etcd at the cluster's own addresses
 * (FORKD_CLUSTER is the layout's 10.240.K.x members, reached only through the namespaces `up`
 * makes), which a unit test has not. The real one runs under `forkd cluster up` in
 * test/integration/local-cluster.test.ts, and in the unit test that a gateway refusing its
 * settings fails the wait (it checks them before it connects to anything).
 * Run as `node gateway-cli.js gateway`, it refuses to start without FORKD_CLUSTER and serves GET
 * /v1/health on FORKD_GATEWAY_LISTEN and FORKD_GATEWAY_E2B_LISTEN to the bearer of FORKD_TOKEN.
 */
import { createServer } from "node:http";

function main(): void {
  const env = process.env;
  if (process.argv[2] !== "gateway") return fail(`unknown command '${process.argv[2] ?? ""}'`);
  if (!env.FORKD_CLUSTER?.startsWith("etcd://")) return fail("FORKD_CLUSTER is not set");
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
