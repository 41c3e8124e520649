/**
 * deploy/kubernetes/: every manifest valid against Kubernetes' own schemas (offline, strict
 * fields: test/helpers/kubernetes-schemas.ts), and the cluster design's contract held by them:
 * nodes only on /dev/kvm hosts with every FORKD_* a node needs, three etcd members the nodes and
 * gateways are pointed at, at least two gateways behind a Service, selectors that select. A
 * broken manifest fails the same check.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import type { IConfigMap } from "kubernetes-models/v1/ConfigMap";
import type { IContainer } from "kubernetes-models/v1/Container";
import type { IEnvVar } from "kubernetes-models/v1/EnvVar";
import type { IPodTemplateSpec } from "kubernetes-models/v1/PodTemplateSpec";
import type { IProbe } from "kubernetes-models/v1/Probe";
import type { ISecret } from "kubernetes-models/v1/Secret";
import type { IService } from "kubernetes-models/v1/Service";
import type { IDaemonSet } from "kubernetes-models/apps/v1/DaemonSet";
import type { IDeployment } from "kubernetes-models/apps/v1/Deployment";
import type { IStatefulSet } from "kubernetes-models/apps/v1/StatefulSet";
import { parse } from "yaml";
import { REPO_DIR } from "../../src/host/paths.js";
import { parseManifests, validateManifests } from "../helpers/kubernetes-schemas.js";
import type { Manifest } from "../helpers/kubernetes-schemas.js";

const DIR = join(REPO_DIR, "deploy", "kubernetes");
const NAMESPACE = "forkd";
/** What a node is given (docs/cluster.md; the guide's design). */
const NODE_ENV = [
  "FORKD_CLUSTER",
  "FORKD_CLUSTER_PREFIX",
  "FORKD_NODE_ID",
  "FORKD_NODE_ADDR",
  "FORKD_NODE_E2B_ADDR",
  "FORKD_LISTEN",
  "FORKD_E2B_LISTEN",
  "FORKD_CLUSTER_SECRET_FILE",
  "FORKD_CLUSTER_CA",
  "FORKD_CLUSTER_CERT",
  "FORKD_CLUSTER_KEY",
  "FORKD_DATA_DIR",
  "FORKD_CACHE_DIR",
];
const GATEWAY_ENV = [
  "FORKD_CLUSTER",
  "FORKD_CLUSTER_PREFIX",
  "FORKD_CLUSTER_SECRET_FILE",
  "FORKD_CLUSTER_CA",
  "FORKD_CLUSTER_CERT",
  "FORKD_CLUSTER_KEY",
  "FORKD_GATEWAY_LISTEN",
  "FORKD_GATEWAY_E2B_LISTEN",
];

interface Deploy {
  /** The manifest files (kustomization.yaml aside). */
  files: string[];
  manifests: Manifest[];
  kustomization: unknown;
}

async function load(): Promise<Deploy> {
  const files = (await readdir(DIR)).filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml").sort();
  const manifests: Manifest[] = [];
  for (const f of files) manifests.push(...parseManifests(await readFile(join(DIR, f), "utf8"), f));
  const kustomization: unknown = parse(await readFile(join(DIR, "kustomization.yaml"), "utf8"));
  return { files, manifests, kustomization };
}
const loaded = load();

function one<T>(d: Deploy, kind: string, name: string): T {
  const found = d.manifests.filter((m) => m.kind === kind && m.name === name);
  assert.equal(found.length, 1, `one ${kind} ${name}`);
  return found[0]?.body as T;
}

function container(pod: IPodTemplateSpec, name: string): IContainer {
  const c = pod.spec?.containers.find((x) => x.name === name);
  assert.ok(c, `container ${name}`);
  return c;
}

function env(c: IContainer): Map<string, IEnvVar> {
  return new Map((c.env ?? []).map((e) => [e.name, e]));
}

/** A variable's plain value (as written: $(VAR) references are not expanded). */
function value(vars: Map<string, IEnvVar>, name: string): string {
  const v = vars.get(name)?.value;
  assert.ok(v !== undefined, `${name} has a value`);
  return v;
}

/** The port of a `HOST:PORT` listen address or of an `http://HOST:PORT` URL. */
const portOf = (s: string): number => Number(/:(\d+)$/.exec(s)?.[1] ?? NaN);

/** The value a configMapKeyRef resolves to in the manifests. */
function fromConfigMap(d: Deploy, e: IEnvVar | undefined): string {
  const ref = e?.valueFrom?.configMapKeyRef;
  assert.ok(ref?.name && ref.key, `${e?.name} comes from a ConfigMap`);
  const v = one<IConfigMap>(d, "ConfigMap", ref.name).data?.[ref.key];
  assert.ok(v, `ConfigMap ${ref.name} has ${ref.key}`);
  return v;
}

function assertHealthProbe(p: IProbe | undefined, port: string, what: string): void {
  assert.equal(p?.httpGet?.path, "/v1/health", `${what} probes GET /v1/health`);
  assert.equal(p.httpGet.port, port, `${what} probes the ${port} port`);
}

/** The cluster secret's volume: mounted where FORKD_CLUSTER_SECRET_FILE points, mode 0600. */
function assertSecretMounted(d: Deploy, pod: IPodTemplateSpec, c: IContainer): void {
  const file = value(env(c), "FORKD_CLUSTER_SECRET_FILE");
  const secret = one<ISecret>(d, "Secret", "forkd-cluster-secret");
  const volume = pod.spec?.volumes?.find((v) => v.secret?.secretName === "forkd-cluster-secret");
  assert.ok(volume?.secret, "the cluster secret is a volume");
  assert.equal(volume.secret.defaultMode, 0o600);
  const mount = c.volumeMounts?.find((m) => m.name === volume.name);
  assert.ok(mount?.readOnly, "mounted read-only");
  const key = Object.keys(secret.stringData ?? secret.data ?? {})[0];
  assert.equal(file, `${mount.mountPath}/${key}`, "FORKD_CLUSTER_SECRET_FILE is the secret's key");
}

/** Where a container mounts the volume of Secret `secret`. */
function secretMount(pod: IPodTemplateSpec, c: IContainer, secret: string): string {
  const volume = pod.spec?.volumes?.find((v) => v.secret?.secretName === secret);
  assert.ok(volume, `the Secret ${secret} is a volume`);
  const mount = c.volumeMounts?.find((m) => m.name === volume.name);
  assert.ok(mount?.readOnly, `${secret} is mounted read-only`);
  return mount.mountPath;
}

/** etcd's CA and the client certificate: the files deploy/etcd-certs.sh makes in client/. */
function assertEtcdClient(pod: IPodTemplateSpec, c: IContainer): void {
  const dir = secretMount(pod, c, "forkd-etcd-client");
  const vars = env(c);
  assert.equal(value(vars, "FORKD_CLUSTER_CA"), `${dir}/ca.crt`);
  assert.equal(value(vars, "FORKD_CLUSTER_CERT"), `${dir}/client.crt`);
  assert.equal(value(vars, "FORKD_CLUSTER_KEY"), `${dir}/client.key`);
}

test("every manifest is valid against Kubernetes' own schemas (kubernetes-models, strict fields)", async () => {
  const d = await loaded;
  assert.deepEqual(await validateManifests(d.manifests), []);
  const kinds = new Set(d.manifests.map((m) => `${m.apiVersion} ${m.kind}`));
  for (const k of [
    "v1 Namespace",
    "v1 ConfigMap",
    "v1 Secret",
    "v1 Service",
    "apps/v1 StatefulSet",
    "apps/v1 DaemonSet",
    "apps/v1 Deployment",
    "policy/v1 PodDisruptionBudget",
    "networking.k8s.io/v1 NetworkPolicy",
  ]) {
    assert.ok(kinds.has(k), `the manifests have a ${k}`);
  }
});

test("kustomization.yaml applies every manifest but the templates, in forkd's namespace, with its images", async () => {
  const d = await loaded;
  const k = d.kustomization as {
    kind?: string;
    namespace?: string;
    resources?: string[];
    images?: { name: string }[];
  };
  assert.equal(k.kind, "Kustomization");
  assert.equal(k.namespace, NAMESPACE);
  const templates = d.files.filter((f) => f.endsWith(".example.yaml"));
  assert.deepEqual(
    [...(k.resources ?? [])].sort(),
    d.files.filter((f) => !templates.includes(f)),
  );
  for (const m of d.manifests) {
    if (m.kind === "Namespace") assert.equal(m.name, NAMESPACE);
    else
      assert.equal((m.body.metadata as { namespace?: string }).namespace, NAMESPACE, `${m.file} ${m.name}`);
  }
  const images = new Set((k.images ?? []).map((i) => i.name));
  const pods = [
    one<IDaemonSet>(d, "DaemonSet", "forkd-node").spec?.template,
    one<IDeployment>(d, "Deployment", "forkd-gateway").spec?.template,
    one<IStatefulSet>(d, "StatefulSet", "etcd").spec?.template,
  ];
  for (const p of pods) {
    for (const c of p?.spec?.containers ?? []) {
      assert.ok(images.has(c.image?.split(":")[0] ?? ""), `kustomization.yaml names the image ${c.image}`);
    }
  }
});

test("a node runs on /dev/kvm hosts only, mounts /dev/kvm and its host directories, and gets every FORKD_* a node needs", async () => {
  const d = await loaded;
  const ds = one<IDaemonSet>(d, "DaemonSet", "forkd-node");
  const pod = ds.spec?.template;
  assert.ok(pod?.spec);
  assert.deepEqual(pod.spec.nodeSelector, { "forkd.dev/kvm": "true" });
  const c = container(pod, "forkd");
  assert.deepEqual(c.args, ["daemon"]);
  assert.equal(c.securityContext?.privileged, true);

  const hostPath = (path: string): string => {
    const v = pod.spec?.volumes?.find((x) => x.hostPath?.path === path);
    assert.ok(v, `a hostPath volume of ${path}`);
    const m = c.volumeMounts?.find((x) => x.name === v.name);
    assert.ok(m, `${path} is mounted`);
    return m.mountPath;
  };
  assert.equal(hostPath("/dev/kvm"), "/dev/kvm");
  assert.equal(pod.spec.volumes?.find((v) => v.hostPath?.path === "/dev/kvm")?.hostPath?.type, "CharDevice");

  const vars = env(c);
  assert.deepEqual(
    NODE_ENV.filter((n) => !vars.has(n)),
    [],
    "every FORKD_* a node needs is set",
  );
  assert.equal(hostPath("/var/lib/forkd"), value(vars, "FORKD_DATA_DIR"));
  assert.equal(hostPath("/var/cache/forkd"), value(vars, "FORKD_CACHE_DIR"));
  assert.equal(
    vars.get("FORKD_NODE_ID")?.valueFrom?.fieldRef?.fieldPath,
    "spec.nodeName",
    "the node id is the host's",
  );
  assert.equal(vars.get("POD_IP")?.valueFrom?.fieldRef?.fieldPath, "status.podIP");
  // $(POD_IP) expands only to a variable defined before it.
  const names = (c.env ?? []).map((e) => e.name);
  for (const [addr, listen] of [
    ["FORKD_NODE_ADDR", "FORKD_LISTEN"],
    ["FORKD_NODE_E2B_ADDR", "FORKD_E2B_LISTEN"],
  ] as const) {
    assert.match(value(vars, addr), /^http:\/\/\$\(POD_IP\):\d+$/, `${addr} is the pod's address`);
    assert.ok(names.indexOf("POD_IP") < names.indexOf(addr));
    assert.equal(
      portOf(value(vars, addr)),
      portOf(value(vars, listen)),
      `${addr} is where ${listen} listens`,
    );
  }
  const api = c.ports?.find((p) => p.name === "api");
  assert.equal(api?.containerPort, portOf(value(vars, "FORKD_LISTEN")));
  for (const [p, what] of [
    [c.startupProbe, "startup"],
    [c.readinessProbe, "readiness"],
    [c.livenessProbe, "liveness"],
  ] as const) {
    assertHealthProbe(p, "api", what);
  }
  assert.match(fromConfigMap(d, vars.get("FORKD_CLUSTER_PREFIX")), /^\/.*\/$/);
  assertSecretMounted(d, pod, c);
  assertEtcdClient(pod, c);
});

test("gateways: two replicas or more on different hosts, behind a Service with the REST and E2B ports", async () => {
  const d = await loaded;
  const dep = one<IDeployment>(d, "Deployment", "forkd-gateway");
  assert.ok((dep.spec?.replicas ?? 1) >= 2, "at least two gateways");
  const pod = dep.spec?.template;
  assert.ok(pod?.spec);
  const anti = pod.spec.affinity?.podAntiAffinity?.preferredDuringSchedulingIgnoredDuringExecution?.[0];
  assert.equal(anti?.podAffinityTerm.topologyKey, "kubernetes.io/hostname");
  assert.deepEqual(
    anti.podAffinityTerm.labelSelector?.matchLabels,
    pod.metadata?.labels,
    "spread from each other",
  );
  const c = container(pod, "gateway");
  assert.deepEqual(c.args, ["gateway"]);
  const vars = env(c);
  assert.deepEqual(
    GATEWAY_ENV.filter((n) => !vars.has(n)),
    [],
    "every FORKD_* a gateway needs is set",
  );
  assert.equal(
    fromConfigMap(d, vars.get("FORKD_CLUSTER")),
    fromConfigMap(d, env(nodeContainer(d)).get("FORKD_CLUSTER")),
  );
  assertHealthProbe(c.readinessProbe, "api", "readiness");
  assertHealthProbe(c.livenessProbe, "api", "liveness");
  assert.notEqual(c.securityContext?.privileged, true);
  assert.deepEqual(c.securityContext?.capabilities?.drop, ["ALL"]);
  assertSecretMounted(d, pod, c);
  assertEtcdClient(pod, c);

  const svc = one<IService>(d, "Service", "forkd");
  assert.deepEqual(svc.spec?.selector, pod.metadata?.labels);
  const ports = new Map((c.ports ?? []).map((p) => [p.name, p.containerPort]));
  assert.equal(ports.get("api"), portOf(value(vars, "FORKD_GATEWAY_LISTEN")));
  assert.equal(ports.get("e2b"), portOf(value(vars, "FORKD_GATEWAY_E2B_LISTEN")));
  assert.deepEqual(
    (svc.spec?.ports ?? []).map((p) => p.targetPort).sort(),
    ["api", "e2b"],
    "the Service has the REST and the E2B port",
  );
});

function nodeContainer(d: Deploy): IContainer {
  const pod = one<IDaemonSet>(d, "DaemonSet", "forkd-node").spec?.template;
  assert.ok(pod);
  return container(pod, "forkd");
}

test("etcd: three members under a headless Service, TLS with client certificates, named by FORKD_CLUSTER", async () => {
  const d = await loaded;
  const sts = one<IStatefulSet>(d, "StatefulSet", "etcd");
  assert.equal(sts.spec?.replicas, 3);
  assert.equal(
    sts.spec.podManagementPolicy,
    "Parallel",
    "members start together (a quorum makes the first ready)",
  );
  const svc = one<IService>(d, "Service", sts.spec.serviceName ?? "");
  assert.equal(svc.spec?.clusterIP, "None");
  assert.equal(svc.spec.publishNotReadyAddresses, true);
  const client = svc.spec.ports?.find((p) => p.name === "client")?.port;
  const members = [0, 1, 2].map((i) => `${sts.metadata?.name}-${i}.${svc.metadata?.name}:${client}`);
  assert.equal(fromConfigMap(d, env(nodeContainer(d)).get("FORKD_CLUSTER")), `etcds://${members.join(",")}`);
  const etcd = container(sts.spec.template, "etcd");
  const args = etcd.args ?? [];
  const flag = (name: string): string | undefined =>
    args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
  const initial = flag("initial-cluster");
  assert.equal(initial?.split(",").length, 3, "the initial cluster has the three members");
  assert.ok(initial?.split(",").every((m) => /^etcd-\d=https:\/\//.test(m)));
  for (const f of [
    "listen-client-urls",
    "advertise-client-urls",
    "listen-peer-urls",
    "initial-advertise-peer-urls",
  ]) {
    assert.match(flag(f) ?? "", /^https:\/\//, `--${f} is TLS`);
  }
  assert.ok(
    args.includes("--client-cert-auth") && args.includes("--peer-client-cert-auth"),
    "certificates required",
  );
  const tls = secretMount(sts.spec.template, etcd, "forkd-etcd-server");
  for (const [f, file] of [
    ["cert-file", "server.crt"],
    ["key-file", "server.key"],
    ["trusted-ca-file", "ca.crt"],
    ["peer-cert-file", "server.crt"],
    ["peer-key-file", "server.key"],
    ["peer-trusted-ca-file", "ca.crt"],
  ] as const) {
    assert.equal(flag(f), `${tls}/${file}`, `--${f} is deploy/etcd-certs.sh's server/${file}`);
  }
  // The kubelet probes /health where no certificate is asked for.
  const metrics = etcd.ports?.find((p) => p.name === etcd.readinessProbe?.httpGet?.port);
  assert.match(flag("listen-metrics-urls") ?? "", /^http:\/\//);
  assert.equal(portOf(flag("listen-metrics-urls") ?? ""), metrics?.containerPort);
  const pdbs = d.manifests.filter((m) => m.kind === "PodDisruptionBudget").map((m) => m.body);
  const budget = pdbs.find((p) => JSON.stringify(p.spec).includes('"etcd"')) as
    { spec: { minAvailable: number } } | undefined;
  assert.equal(budget?.spec.minAvailable, 2, "a drain keeps the quorum");
});

test("every Service, PodDisruptionBudget and NetworkPolicy selects the pods of a workload", async () => {
  const d = await loaded;
  const podLabels = d.manifests
    .filter((m) => ["DaemonSet", "Deployment", "StatefulSet"].includes(m.kind))
    .map((m) => (m.body as { spec: { template: IPodTemplateSpec } }).spec.template.metadata?.labels ?? {});
  const matches = (sel: Record<string, string>): boolean =>
    podLabels.some((l) => Object.entries(sel).every(([k, v]) => l[k] === v));
  const selectors: Array<[string, Record<string, string> | undefined]> = d.manifests.flatMap((m) => {
    const spec = m.body.spec as Record<
      string,
      { matchLabels?: Record<string, string> } | Record<string, string>
    >;
    if (m.kind === "Service") return [[`Service ${m.name}`, spec.selector as Record<string, string>]];
    if (m.kind === "PodDisruptionBudget")
      return [[`PDB ${m.name}`, spec.selector?.matchLabels as Record<string, string>]];
    if (m.kind === "NetworkPolicy")
      return [[`NetworkPolicy ${m.name}`, spec.podSelector?.matchLabels as Record<string, string>]];
    return [];
  });
  assert.ok(selectors.length >= 6);
  for (const [what, sel] of selectors) assert.ok(sel && matches(sel), `${what} selects some workload's pods`);
  const pdbFor = (component: string): boolean =>
    selectors.some(([w, s]) => w.startsWith("PDB") && s?.["app.kubernetes.io/component"] === component);
  assert.ok(pdbFor("gateway") && pdbFor("etcd"), "gateways and etcd have disruption budgets");
});

test("a broken manifest fails the check: a misspelt field, a wrong type, a missing field, an unknown kind, a YAML 1.1 octal", async () => {
  const node = await readFile(join(DIR, "node.yaml"), "utf8");
  const broken = async (from: string, to: string): Promise<string[]> => {
    assert.ok(node.includes(from), `node.yaml has ${JSON.stringify(from)}`);
    return validateManifests(parseManifests(node.replace(from, to), "node.yaml"));
  };
  assert.deepEqual(await broken("", ""), [], "the unbroken file passes");
  const misspelt = await broken("      nodeSelector:\n", "      nodeSelecter:\n");
  assert.match(misspelt.join("\n"), /\.spec\.template\.spec\.nodeSelecter: no such field/);
  const deep = await broken(
    "              mountPath: /dev/kvm\n",
    "              mountPath: /dev/kvm\n              readonly: true\n",
  );
  assert.match(deep.join("\n"), /\.volumeMounts\[0\]\.readonly: no such field/);
  const wrongType = await broken("containerPort: 8080", 'containerPort: "8080"');
  assert.match(wrongType.join("\n"), /containerPort must be integer/);
  const badEnum = await broken("type: CharDevice", "type: CharacterDevice");
  assert.match(badEnum.join("\n"), /hostPath\/type must be equal to one of the allowed values/);
  const missing = await broken("        - name: forkd\n          image:", "        - image:");
  assert.match(missing.join("\n"), /containers\/0 must have required property name/);
  const kind = await broken("kind: DaemonSet", "kind: DeamonSet");
  assert.match(kind.join("\n"), /Kubernetes has no kind DeamonSet in apps\/v1/);
  assert.throws(
    () => parseManifests(node.replace("defaultMode: 384", "defaultMode: 0600"), "node.yaml"),
    /YAML 1\.1/,
  );
});
