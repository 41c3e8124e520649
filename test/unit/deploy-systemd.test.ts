/**
 * deploy/systemd/: the node's and the gateway's units and the etcd drop-in pass `systemd-analyze
 * verify` (every directive known and well-formed, every program there; installed paths mapped
 * onto this checkout), the node's unit lets sandboxes outlive a daemon restart and has no
 * option that would break QEMU, netns or nftables, and the example environments give a node
 * and a gateway what the design asks for.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";

const DIR = join(REPO_DIR, "deploy", "systemd");
const ANALYZE = "/usr/bin/systemd-analyze";
/** Debian's etcd-server unit, the one the drop-in is for. */
const DEBIAN_ETCD = "/lib/systemd/system/etcd.service";

/** A unit's directives (comments and section headers left out), as [key, value] in order. */
function directives(text: string): Array<[string, string]> {
  return text
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#") && !l.startsWith("["))
    .map((l) => {
      const i = l.indexOf("=");
      return [l.slice(0, i), l.slice(i + 1)];
    });
}

const read = (name: string): Promise<string> => readFile(join(DIR, name), "utf8");

async function hasAnalyze(): Promise<boolean> {
  return new Promise((resolve) => execFile(ANALYZE, ["--version"], (err) => resolve(err === null)));
}

interface Verdict {
  code: number;
  output: string;
}

function verify(dir: string, units: string[]): Promise<Verdict> {
  return new Promise((resolve) => {
    execFile(
      ANALYZE,
      ["verify", "--man=no", ...units.map((u) => join(dir, u))],
      // Units (and drop-ins) are looked up in `dir` first, then where systemd keeps its own.
      { env: { ...process.env, SYSTEMD_UNIT_PATH: `${dir}:` }, timeout: 60_000 },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === "number" ? err.code : 1) : 0;
        resolve({ code, output: `${stdout}${stderr}` });
      },
    );
  });
}

/** The units as installed, in a scratch unit directory: /opt/forkd is this checkout. */
async function stage(dir: string): Promise<void> {
  for (const u of ["forkd-node.service", "forkd-gateway.service"]) {
    await writeFile(join(dir, u), (await read(u)).replaceAll("/opt/forkd", REPO_DIR));
  }
  // Debian's etcd.service where etcd-server is installed, else a stand-in with its lines.
  const etcd = await readFile(DEBIAN_ETCD, "utf8").catch(
    () =>
      "[Unit]\nDescription=etcd\n[Service]\nType=notify\nUser=etcd\nExecStart=/bin/true\nRestart=on-abnormal\n",
  );
  await writeFile(join(dir, "etcd.service"), etcd);
  await mkdir(join(dir, "etcd.service.d"));
  await writeFile(join(dir, "etcd.service.d", "forkd.conf"), await read("etcd.service.d/forkd.conf"));
}

/** What verify said about our files: not about Debian's etcd.service itself, nor the host's
 * own units it also loads. */
const ours = (v: Verdict, dir: string): string[] =>
  v.output
    .split("\n")
    .filter(
      (l) => (l.includes(dir) || /forkd|etcd/.test(l)) && !l.startsWith(`${join(dir, "etcd.service")}:`),
    );

test("the units and the etcd drop-in pass systemd-analyze verify, which refuses a broken one", async (t) => {
  if (!(await hasAnalyze())) {
    t.skip(`${ANALYZE} is missing (Debian's systemd package): the units cannot be verified here`);
    return;
  }
  const dir = await mkdtemp(join(tmpdir(), "forkd-units-"));
  try {
    await stage(dir);
    const units = ["forkd-node.service", "forkd-gateway.service", "etcd.service"];
    const good = await verify(dir, units);
    assert.equal(good.code, 0, good.output);
    assert.deepEqual(ours(good, dir), [], "no warning about any of them");

    // verify only warns (and exits 0) on an unknown key or a bad value: each counts here.
    const node = await readFile(join(dir, "forkd-node.service"), "utf8");
    await writeFile(join(dir, "forkd-node.service"), node.replace(/^KillMode=process$/m, "KillMode=proces"));
    const conf = join(dir, "etcd.service.d", "forkd.conf");
    await writeFile(conf, `${await readFile(conf, "utf8")}Restat=always\n`);
    const gw = await readFile(join(dir, "forkd-gateway.service"), "utf8");
    await writeFile(
      join(dir, "forkd-gateway.service"),
      gw.replace("bin/forkd gateway", "bin/forkd-missing gateway"),
    );
    const bad = ours(await verify(dir, units), dir).join("\n");
    assert.match(bad, /forkd-node\.service:\d+: Failed to parse kill mode/);
    assert.match(bad, /forkd\.conf:\d+: Unknown key 'Restat'/);
    assert.match(bad, /bin\/forkd-missing is not executable/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("the node's unit: sandboxes outlive a daemon restart, restarts on failure, nothing that breaks QEMU or netns", async () => {
  const d = new Map(directives(await read("forkd-node.service")));
  assert.equal(d.get("ExecStart"), "/opt/forkd/bin/forkd daemon");
  assert.equal(d.get("EnvironmentFile"), "/etc/forkd/node.env");
  // SIGTERM makes the daemon detach (src/sandbox/shutdown.ts); only it may be signalled.
  assert.equal(d.get("KillMode"), "process");
  assert.equal(d.get("KillSignal"), "SIGTERM");
  assert.equal(d.get("Restart"), "on-failure");
  assert.equal(d.get("TasksMax"), "infinity");
  // A mount namespace of its own would hide /run/netns from the next daemon; a seccomp filter
  // or a device policy would reach the VMMs.
  const breaking = [
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "TemporaryFileSystem",
    "BindPaths",
    "PrivateMounts",
    "PrivateNetwork",
    "ProtectKernelTunables",
    "ProtectControlGroups",
    "DevicePolicy",
    "DeviceAllow",
    "RestrictNamespaces",
    "SystemCallFilter",
    "RestrictAddressFamilies",
    "LockPersonality",
    "ProtectHostname",
    "ProtectClock",
    "CapabilityBoundingSet",
    "DynamicUser",
    "User",
    "OOMScoreAdjust",
  ];
  assert.deepEqual(
    breaking.filter((k) => d.has(k)),
    [],
  );
});

test("the gateway's unit: no privilege, the secret as a credential", async () => {
  const d = directives(await read("forkd-gateway.service"));
  const get = (k: string): string[] => d.filter(([key]) => key === k).map(([, v]) => v);
  assert.deepEqual(get("ExecStart"), ["/opt/forkd/bin/forkd gateway"]);
  assert.deepEqual(get("EnvironmentFile"), ["/etc/forkd/gateway.env"]);
  assert.deepEqual(get("Restart"), ["on-failure"]);
  assert.deepEqual(get("DynamicUser"), ["yes"]);
  assert.deepEqual(get("CapabilityBoundingSet"), [""]);
  // The secret and etcd's client certificate reach the transient user as credentials.
  const credentials = new Map(get("LoadCredential").map((c) => [c.split(":")[0], c.split(":")[1]]));
  const environment = new Map(get("Environment").map((e) => [e.split("=")[0], e.split("=")[1]]));
  for (const [name, file, path] of [
    ["FORKD_CLUSTER_SECRET_FILE", "cluster-secret", "/etc/forkd/cluster-secret"],
    ["FORKD_CLUSTER_CA", "etcd-ca.crt", "/etc/forkd/etcd/ca.crt"],
    ["FORKD_CLUSTER_CERT", "etcd-client.crt", "/etc/forkd/etcd/client.crt"],
    ["FORKD_CLUSTER_KEY", "etcd-client.key", "/etc/forkd/etcd/client.key"],
  ] as const) {
    assert.equal(environment.get(name), `%d/${file}`, name);
    assert.equal(credentials.get(file), path, file);
  }
});

test("the example environments give a node, a gateway and an etcd member what they need", async () => {
  const vars = async (f: string): Promise<Map<string, string>> =>
    new Map(directives(await read(f)).map(([k, v]) => [k, v]));
  const node = await vars("node.env.example");
  for (const k of [
    "FORKD_CLUSTER",
    "FORKD_NODE_ID",
    "FORKD_NODE_ADDR",
    "FORKD_LISTEN",
    "FORKD_CLUSTER_SECRET_FILE",
    "FORKD_CLUSTER_CA",
    "FORKD_CLUSTER_CERT",
    "FORKD_CLUSTER_KEY",
  ]) {
    assert.ok(node.get(k), `node.env.example sets ${k}`);
  }
  assert.match(node.get("FORKD_NODE_ID") ?? "", /^[a-z0-9][a-z0-9-]{0,62}$/);
  // FORKD_NODE_ADDR is where FORKD_LISTEN listens.
  assert.equal(node.get("FORKD_NODE_ADDR"), `http://${node.get("FORKD_LISTEN")}`);
  assert.equal(node.get("FORKD_NODE_E2B_ADDR"), `http://${node.get("FORKD_E2B_LISTEN")}`);
  const gateway = await vars("gateway.env.example");
  for (const k of ["FORKD_CLUSTER", "FORKD_GATEWAY_LISTEN", "FORKD_GATEWAY_E2B_LISTEN"]) {
    assert.ok(gateway.get(k), `gateway.env.example sets ${k}`);
  }
  assert.equal(gateway.get("FORKD_CLUSTER"), node.get("FORKD_CLUSTER"));
  // etcd: TLS with client certificates; the node's first endpoint is this member.
  const etcd = await vars("etcd.env.example");
  const clients = (etcd.get("ETCD_ADVERTISE_CLIENT_URLS") ?? "").replace("https://", "");
  assert.ok(
    node.get("FORKD_CLUSTER")?.startsWith(`etcds://${clients},`),
    "the node's first endpoint is this member",
  );
  assert.equal(etcd.get("ETCD_INITIAL_CLUSTER")?.split(",").length, 3);
  for (const [k, v] of etcd) {
    if (k.endsWith("_URLS") || k === "ETCD_INITIAL_CLUSTER") assert.doesNotMatch(v, /http:/, k);
  }
  assert.equal(etcd.get("ETCD_CLIENT_CERT_AUTH"), "true");
  assert.equal(etcd.get("ETCD_PEER_CLIENT_CERT_AUTH"), "true");
});
