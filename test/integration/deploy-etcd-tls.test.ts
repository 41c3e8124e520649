/**
 * etcd as deploy/kubernetes/etcd.yaml runs it, for real (Debian's etcd 3.4 on loopback): the
 * StatefulSet's own TLS flags with the certificates deploy/etcd-certs.sh makes. A client with
 * forkd's certificate (what nodes and gateways mount) reads and writes; one without a
 * certificate, or with one of another CA, is refused; the kubelet's probe answers without one.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { access, mkdtemp, open, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { IStatefulSet } from "kubernetes-models/apps/v1/StatefulSet";
import { REPO_DIR } from "../../src/host/paths.js";
import { parseManifests } from "../helpers/kubernetes-schemas.js";
import { freePort } from "../helpers/port.js";

const ETCD = "/usr/bin/etcd";
const ETCDCTL = "/usr/bin/etcdctl";
/** Where etcd.yaml mounts the forkd-etcd-server Secret. */
const TLS_MOUNT = "/etc/etcd/tls/";
/** The flags that say where this member is: replaced by loopback ones here. */
const PLACE = [
  "name",
  "data-dir",
  "listen-client-urls",
  "advertise-client-urls",
  "listen-peer-urls",
  "initial-advertise-peer-urls",
  "initial-cluster",
  "listen-metrics-urls",
];

function sh(file: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { env, timeout: 30_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${file} ${args.join(" ")}: ${stderr || err.message}`)) : resolve(stdout),
    );
  });
}

async function statefulSetArgs(): Promise<string[]> {
  const file = join(REPO_DIR, "deploy", "kubernetes", "etcd.yaml");
  const sts = parseManifests(await readFile(file, "utf8"), "etcd.yaml").find((m) => m.kind === "StatefulSet");
  const args = (sts?.body as IStatefulSet | undefined)?.spec?.template.spec?.containers[0]?.args;
  assert.ok(args && args.length > 0, "etcd.yaml's StatefulSet has etcd's flags");
  return args;
}

test("etcd with etcd.yaml's TLS flags and etcd-certs.sh's certificates takes forkd's client and refuses others", async (t) => {
  const missing = await access(ETCD).then(
    () => null,
    () => `${ETCD} is missing (Debian's etcd-server)`,
  );
  if (missing) {
    t.skip(missing);
    return;
  }
  const dir = await mkdtemp(join(tmpdir(), "forkd-etcd-tls-"));
  const certs = join(dir, "certs");
  const other = join(dir, "other");
  await sh(join(REPO_DIR, "deploy", "etcd-certs.sh"), [certs]);
  await sh(join(REPO_DIR, "deploy", "etcd-certs.sh"), [other]);
  const [client, peer, metrics] = [await freePort(), await freePort(), await freePort()];
  const flags = (await statefulSetArgs())
    .filter((a) => !PLACE.includes(/^--([a-z-]+)/.exec(a)?.[1] ?? ""))
    .map((a) => a.replace(TLS_MOUNT, `${join(certs, "server")}/`));
  assert.ok(flags.includes("--client-cert-auth"));
  const log = await open(join(dir, "etcd.log"), "a");
  const etcd = spawn(
    ETCD,
    [
      ...flags,
      "--name=etcd-0",
      `--data-dir=${join(dir, "data")}`,
      `--listen-client-urls=https://127.0.0.1:${client}`,
      `--advertise-client-urls=https://localhost:${client}`,
      `--listen-peer-urls=https://127.0.0.1:${peer}`,
      `--initial-advertise-peer-urls=https://localhost:${peer}`,
      `--initial-cluster=etcd-0=https://localhost:${peer}`,
      `--listen-metrics-urls=http://127.0.0.1:${metrics}`,
    ],
    { stdio: ["ignore", log.fd, log.fd] },
  );
  await log.close();
  const ctl = (tls: string[], ...args: string[]): Promise<string> =>
    sh(ETCDCTL, [`--endpoints=https://localhost:${client}`, "--command-timeout=5s", ...tls, ...args], {
      ...process.env,
      ETCDCTL_API: "3",
    });
  const forkd = ["client/ca.crt", "client/client.crt", "client/client.key"].map((f) => join(certs, f));
  const asForkd = [`--cacert=${forkd[0]}`, `--cert=${forkd[1]}`, `--key=${forkd[2]}`];
  try {
    // The kubelet's readiness probe: /health on the metrics port, no certificate.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const health = await fetch(`http://127.0.0.1:${metrics}/health`).then(
        async (r) => (r.ok ? ((await r.json()) as { health?: string }) : null),
        () => null,
      );
      if (health?.health === "true") break;
      if (Date.now() > deadline || etcd.exitCode !== null) {
        assert.fail(`etcd did not become healthy: ${await readFile(join(dir, "etcd.log"), "utf8")}`);
      }
      await new Promise((r) => setTimeout(r, 200));
    }

    await ctl(asForkd, "put", "/forkd/probe", "ok");
    assert.equal(await ctl(asForkd, "get", "--print-value-only", "/forkd/probe"), "ok\n");

    const noCert = [`--cacert=${forkd[0]}`];
    await assert.rejects(ctl(noCert, "get", "/forkd/probe"), "a client without a certificate is refused");
    const otherCa = [
      `--cacert=${forkd[0]}`,
      `--cert=${join(other, "client", "client.crt")}`,
      `--key=${join(other, "client", "client.key")}`,
    ];
    await assert.rejects(ctl(otherCa, "get", "/forkd/probe"), "a certificate of another CA is refused");
    await assert.rejects(
      ctl(
        [`--cacert=${join(other, "client", "ca.crt")}`, asForkd[1] ?? "", asForkd[2] ?? ""],
        "get",
        "/forkd/probe",
      ),
      "a client that trusts another CA does not trust this etcd",
    );
  } finally {
    if (etcd.exitCode === null) {
      const exited = new Promise((r) => etcd.once("exit", r));
      etcd.kill("SIGKILL");
      await exited;
    }
    await rm(dir, { recursive: true, force: true });
  }
});
