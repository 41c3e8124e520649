/**
 * Snapshots from Dockerfiles, with real VMs (one daemon): the CLI builds a Dockerfile with ARG,
 * ENV, WORKDIR, COPY (a glob; a directory's contents; a .dockerignore'd file left out), RUN and CMD; a fork of it has the files
 * and the image config; an unchanged rebuild (through the SDK) reuses every step and boots no
 * build VM; a changed COPY'd file reruns only its step and the later ones; a failing RUN reports
 * its output and exit code and leaves no snapshot; a Dockerfile FROM an image in a loopback
 * registry (a static busybox tree: no Python) runs its COPY and RUN in that image and records
 * the pulled image as the build's base. Tenants (tokens over TCP): a tenant's build VM is jailed
 * (not root, no capabilities, a forkd cgroup with its limits, its RAM in its own directory under
 * run/, not in the shared cache, a mount namespace without the others' files); tenant B building
 * A's Dockerfile (a RUN writing a random value) gets a value of its own and nothing of A's is
 * cached for B (that A's own rebuild is: test/unit/dockerfile-owner-cache.test.ts); a tenant over its caps gets 403 naming the cap before
 * anything runs, and one whose RUN writes past its build disk cap is stopped, naming that cap. The host
 * tools the build runs on the disks its VM wrote (qemu-img, e2fsck) run jailed.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { ApiClient, ForkdError as SdkError } from "@forkd/sdk";
import type { SnapshotProgress } from "@forkd/sdk";
import { contextPaths, contextTar } from "../../src/cli/build-context.js";
import { checkedRequest } from "../helpers/contract.js";
import { CLI, cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";
import { daemonToolRuns } from "../helpers/prometheus.js";
import { busyboxTar, pushImage } from "../helpers/oci-images.js";
import { startRegistry } from "../helpers/registry.js";
import type { TestRegistry } from "../helpers/registry.js";
import { until } from "../helpers/fake-sandboxes.js";
import { freePort } from "../helpers/port.js";
import { asVmm, gidOf, procStatus, qemuNaming, uidOf } from "../helpers/vmm-process.js";
import { defaultPaths } from "../../src/host/paths.js";

let d: TestDaemon;
let ctx: string;
let reg: TestRegistry | undefined;
const { step, failed } = steps();
// The step cache is the host's (shared by runs): a fresh value in the first step makes every
// key of this run new, so the first build really runs its steps.
const NONCE = randomBytes(8).toString("hex");

const DOCKERFILE = `# escape=\\
ARG BASE=forkd://python
FROM \${BASE}
ARG NONCE
ENV GREETING="hello world" \\
    APPDIR=/app
WORKDIR $APPDIR
# a comment between instructions
COPY [^l]* /ctx/
RUN echo "$NONCE $GREETING" > run.txt && echo "step-output-$NONCE" \
  && cat /sys/class/net/eth0/operstate > net.txt
COPY late.txt ./late.txt
RUN cp late.txt late-copy.txt
CMD ["python3", "-V"]
`;

const api = <T>(method: string, path: string, body?: unknown, timeoutMs = 120_000) =>
  checkedRequest<T>(d.ep, method, path, body, timeoutMs);

async function sh(tag: string, cmd: string): Promise<string> {
  const f = await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", { snapshot_tag: tag });
  const id = f.sandboxes[0]!.id;
  try {
    const r = await api<{ stdout: string; exit_code: number }>("POST", `/v1/sandboxes/${id}/exec`, { cmd });
    assert.equal(r.exit_code, 0, r.stdout);
    return r.stdout;
  } finally {
    await api("DELETE", `/v1/sandboxes/${id}`).catch(() => undefined);
  }
}

/** Tenants' tokens (made in the first tenant step) and the daemon's TCP listener. */
const tokens: Record<string, string> = {};
let url = "";
const as = (tenant: string) => new ApiClient({ url, token: tokens[tenant] ?? "" });

async function build(
  tag: string,
  dir: string,
  client = new ApiClient({ socket: d.ep.socket }),
  query: { memory_mib?: number; vcpus?: number } = {},
): Promise<{ messages: string[]; content: string }> {
  const tar = contextTar(dir, await contextPaths(dir, join(dir, "Dockerfile")));
  const messages: string[] = [];
  const [m] = await Promise.all([
    client.buildSnapshot({ tag, build_args: { NONCE }, ...query }, tar.stream, {
      onProgress: (ev: SnapshotProgress) => messages.push(ev.message),
    }),
    tar.done,
  ]);
  return { messages, content: m.image.content ?? "" };
}

before(async () => {
  // No warm pool: nothing here is about it, and its members (two per snapshot built, restored
  // and warmed) would compete with the builds for the CPU.
  // Tenants reach it over TCP (loopback), with the operator's caps lowered to be crossed.
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  d = await makeDaemon({
    FORKD_POOL_SIZE: "0",
    FORKD_LISTEN: `127.0.0.1:${port}`,
    FORKD_TENANT_MAX_MEMORY_MIB: "1024",
    FORKD_TENANT_MAX_VCPUS: "2",
  }); // started
  ctx = await mkdtemp(join(tmpdir(), "forkd-df-"));
  await writeFile(join(ctx, "Dockerfile"), DOCKERFILE);
  await writeFile(join(ctx, ".dockerignore"), "secret.txt\n");
  await writeFile(join(ctx, "secret.txt"), "not for the image\n");
  await writeFile(join(ctx, "late.txt"), "late v1\n");
  await mkdir(join(ctx, "conf"));
  await writeFile(join(ctx, "conf", "tool.sh"), "#!/bin/sh\necho tool\n", { mode: 0o755 });
});

after(async () => {
  await d?.destroy(failed());
  await reg?.stop();
  if (ctx) await rm(ctx, { recursive: true, force: true });
  if (tenantCtx) await rm(tenantCtx, { recursive: true, force: true });
});

let first = "";

step("forkd snapshot --dockerfile builds an image a fork has the files and config of", async () => {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [
      CLI,
      "snapshot",
      "--tag",
      "df1",
      "--dockerfile",
      join(ctx, "Dockerfile"),
      "--build-arg",
      `NONCE=${NONCE}`,
      "--json",
    ],
    { env: d.env, timeout: 20 * 60_000, maxBuffer: 16 << 20 },
  );
  const meta = JSON.parse(stdout) as { tag: string; image: { content: string } };
  assert.equal(meta.tag, "df1");
  first = meta.image.content;
  const out = await sh(
    "df1",
    "cat /app/run.txt /app/late-copy.txt; ls -A /ctx | tr '\\n' ' '; echo; stat -c %a /ctx/tool.sh; tr '\\0' '\\n' < /.forkd/env; cat /.forkd/config",
  );
  const lines = out.split("\n");
  assert.equal(lines[0], `${NONCE} hello world`, "RUN saw ARG and ENV, in WORKDIR");
  assert.equal(lines[1], "late v1");
  assert.deepEqual(lines[2]?.trim().split(" ").sort(), [".dockerignore", "Dockerfile", "tool.sh"]);
  assert.equal(lines[3], "755", "COPY kept the file's mode");
  assert.ok(lines.includes("GREETING=hello world"), out);
  assert.ok(lines.includes("APPDIR=/app"), out);
  assert.ok(!lines.some((l) => l.startsWith("NONCE=")), "ARG values are not part of the image's env");
  assert.ok(lines.includes("cwd=/app"), out);
  assert.ok(lines.includes('cmd=["python3","-V"]'), out);
});

step("the build ran qemu-img and e2fsck on what its VM wrote jailed, never as the daemon", async () => {
  const runs = await daemonToolRuns(d.ep);
  assert.ok((runs.jailed["qemu-img"] ?? 0) >= 2, `jailed: ${JSON.stringify(runs)}`); // commit rebase, flatten
  assert.ok((runs.jailed.e2fsck ?? 0) >= 1, `jailed: ${JSON.stringify(runs)}`);
  assert.deepEqual(runs.unjailed, {});
});

step("an unchanged rebuild reuses every step and boots no build VM", async () => {
  const r = await build("df2", ctx);
  assert.equal(r.content, first, "the same image");
  const stepLines = r.messages.filter((m) => /^step \d+\/\d+: /.test(m));
  assert.equal(stepLines.length, 5, r.messages.join("\n"));
  assert.ok(
    stepLines.every((m) => m.endsWith(": cached")),
    r.messages.join("\n"),
  );
  assert.ok(!r.messages.some((m) => m.startsWith("boot: starting the build VM")), r.messages.join("\n"));
});

step("a changed COPY'd file reruns only its step and the later ones", async () => {
  await writeFile(join(ctx, "late.txt"), "late v2\n");
  const r = await build("df3", ctx);
  const cached = r.messages.filter((m) => /^step \d+\/5: .*: cached$/.test(m)).map((m) => m.split(":")[0]);
  assert.deepEqual(cached, ["step 1/5", "step 2/5"], r.messages.join("\n"));
  const ran = r.messages.filter((m) => /^step \d+\/5: .*done in/.test(m)).map((m) => m.split(":")[0]);
  assert.deepEqual(ran, ["step 3/5", "step 4/5", "step 5/5"], r.messages.join("\n"));
  assert.notEqual(r.content, first);
  const out = (await sh("df3", "cat /app/late-copy.txt /app/net.txt")).split("\n");
  assert.equal(out[0], "late v2");
  // The build VM's network: a netns slot where the host has them (root here), else none, said so.
  const net = r.messages.find((m) => m.startsWith("network: "));
  assert.ok(net, r.messages.join("\n"));
  if (process.getuid?.() === 0) {
    assert.equal(net, "network: netns, egress allow");
    assert.equal(out[1], "up", "the RUN step saw eth0 up");
  }
});

step("a failing RUN shows its output and exit code, and no snapshot is left", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-df-fail-"));
  try {
    await writeFile(
      join(dir, "Dockerfile"),
      `FROM forkd://python\nRUN echo "out-marker-${NONCE}"; echo err-marker >&2; exit 7\n`,
    );
    await assert.rejects(
      build("dfail", dir),
      (e: Error & { code?: string; details?: Record<string, unknown> }) => {
        assert.match(e.message, /line 2: RUN failed \(exit code 7\)/);
        assert.match(e.message, new RegExp(`out-marker-${NONCE}`));
        assert.match(e.message, /err-marker/);
        assert.equal(e.details?.exit_code, 7);
        return true;
      },
    );
    const list = await api<{ snapshots: { tag: string }[] }>("GET", "/v1/snapshots");
    assert.ok(!list.snapshots.some((s) => s.tag === "dfail"));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

step(
  "FROM an image in a registry: COPY and RUN run in that image; the source names the pulled base",
  async () => {
    const dir = await mkdtemp(join(tmpdir(), "forkd-df-reg-"));
    try {
      reg = await startRegistry(dir);
      // busybox-static: no Python, /bin/sh an applet symlink to /bin/busybox
      const img = await pushImage(
        reg.host,
        "forkd-test/busybox-df",
        "v1",
        [{ tar: busyboxTar(), compression: "gzip" }],
        {
          config: { Env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], WorkingDir: "/", Cmd: ["sh"] },
        },
      );
      const from = `${reg.host}/forkd-test/busybox-df:v1`;
      const context = join(dir, "context");
      await mkdir(context);
      await writeFile(
        join(context, "Dockerfile"),
        `FROM ${from}\nARG NONCE\nENV WHO=busybox\nCOPY hello.txt /data/\n` +
          `RUN echo "$NONCE $WHO $(cat /data/hello.txt)" > /data/run.txt && readlink /bin/sh > /data/sh.txt\n`,
      );
      await writeFile(join(context, "hello.txt"), `hello ${NONCE}\n`);
      const r = await build("dfreg", context);
      const ran = r.messages.filter((m) => /^step \d+\/3: .*done in/.test(m)).map((m) => m.split(":")[0]);
      assert.deepEqual(ran, ["step 1/3", "step 2/3", "step 3/3"], r.messages.join("\n"));
      const out = (
        await sh(
          "dfreg",
          "cat /data/run.txt /data/sh.txt; test -e /usr/bin/python3 && echo python || echo no-python; tr '\\0' '\\n' < /.forkd/env",
        )
      ).split("\n");
      assert.equal(out[0], `${NONCE} busybox hello ${NONCE}`, "RUN saw the ARG, the ENV and the COPY'd file");
      assert.equal(out[1], "/bin/busybox", "RUN ran in the busybox image");
      assert.equal(out[2], "no-python");
      assert.ok(out.includes("WHO=busybox"), out.join("\n"));
      assert.ok(out.includes("PATH=/usr/sbin:/usr/bin:/sbin:/bin"), "the base image's Env is kept");
      const list = await api<{ snapshots: { tag: string; template: string; source: unknown }[] }>(
        "GET",
        "/v1/snapshots",
      );
      const snap = list.snapshots.find((x) => x.tag === "dfreg");
      assert.equal(snap?.template, "dockerfile");
      const source = snap?.source as { kind: string; from: string; base: unknown; key: string };
      assert.equal(source.kind, "dockerfile");
      assert.equal(source.from, from);
      assert.deepEqual(source.base, { kind: "image", ref: from, digest: img.digest });
      assert.match(source.key, /^[0-9a-f]{64}$/);
    } finally {
      await reg?.stop();
      reg = undefined;
      await rm(dir, { recursive: true, force: true });
    }
  },
);

// ---------------------------------------------------------------- tenants

/** A Dockerfile whose RUN writes a value nobody can guess (the same text for every tenant). */
const SECRET_DOCKERFILE = `FROM forkd://python
ARG NONCE
RUN echo "$NONCE" > /nonce && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /secret
`;
let tenantCtx = "";
let aliceSecret = "";
let aliceContent = "";

/** The cgroup the process is in under forkd/, and its memory, tasks and CPU limits. */
async function cgroupLimits(
  pid: number,
): Promise<{ name: string; memory: string; pids: string; cpu: string }> {
  const lines = await readFile(`/proc/${pid}/cgroup`, "utf8");
  const name = /^(?:\d+:memory|0:):\/forkd\/(b-[0-9a-f]+)$/m.exec(lines)?.[1];
  assert.ok(name, `in a forkd cgroup: ${lines}`);
  const v1 = await readFile(`/sys/fs/cgroup/memory/forkd/${name}/memory.limit_in_bytes`, "utf8").catch(
    () => null,
  );
  const read = (p: string) => readFile(`/sys/fs/cgroup/${p}`, "utf8").then((t) => t.trim());
  if (v1 !== null)
    return {
      name,
      memory: v1.trim(),
      pids: await read(`pids/forkd/${name}/pids.max`),
      cpu: await read(`cpu/forkd/${name}/cpu.cfs_quota_us`),
    };
  return {
    name,
    memory: await read(`forkd/${name}/memory.max`),
    pids: await read(`forkd/${name}/pids.max`),
    cpu: (await read(`forkd/${name}/cpu.max`)).split(" ")[0] ?? "",
  };
}

step(
  "a tenant's build VM is jailed: not root, no capabilities, a forkd cgroup with limits, its RAM in its own directory",
  async () => {
    for (const [tenant, extra] of [
      ["alice", []],
      ["bob", []],
      ["carol", ["--max-build-disk-mib", "48"]],
    ] as const) {
      const r = await cli(d, ["token", "create", "--tenant", tenant, ...extra]);
      assert.equal(r.code, 0, r.stderr);
      tokens[tenant] = r.stdout.trim();
    }
    tenantCtx = await mkdtemp(join(tmpdir(), "forkd-df-tenant-"));
    await writeFile(join(tenantCtx, "Dockerfile"), SECRET_DOCKERFILE);
    const built = build("t-alice", tenantCtx, as("alice"));
    built.catch(() => undefined); // a failed assertion below must not leave it unheard
    const runDir = join(d.dataDir, "run");
    let pid: number | null = null;
    for (let i = 0; i < 3000 && pid === null; i++) {
      pid = await qemuNaming(join(runDir, "b-"));
      if (pid === null) await new Promise((r) => setTimeout(r, 200));
    }
    assert.ok(pid, "the build VM's QEMU was seen");
    const st = await procStatus(pid);
    assert.notEqual(uidOf(st), "0", "not root");
    assert.equal(st.CapEff, "0000000000000000");
    assert.equal(st.NoNewPrivs, "1");
    // QEMU installs its seccomp filter as it starts (the jailer set the uid and capabilities before).
    await until("QEMU's seccomp filter", async () => (await procStatus(pid)).Seccomp === "2", 120_000);
    const cg = await cgroupLimits(pid);
    assert.equal(cg.memory, String((512 + 384) * 2 ** 20), "guest RAM + 384 MiB");
    assert.equal(cg.pids, "256");
    assert.equal(cg.cpu, "100000", "one vCPU: one core's time");
    // Its RAM: a file in its own directory under run/, not in the shared cache.
    const memPath = /mem-path=([^,]+)/.exec((await processArgs(pid)).join(" "))?.[1] ?? "";
    const cacheDir = defaultPaths(d.env).cacheDir;
    assert.ok(memPath.startsWith(join(runDir, cg.name) + "/"), memPath);
    assert.ok(!memPath.startsWith(cacheDir + "/"), memPath);
    // In its mount namespace: only its own directory under run/, only its base image in the cache.
    const own = await asVmm(uidOf(st), gidOf(st), ["ls", "-A", runDir], pid);
    assert.ok(own.ok, own.out);
    assert.equal(own.out.trim(), cg.name);
    const images = await asVmm(uidOf(st), gidOf(st), ["ls", "-A", join(cacheDir, "images")], pid);
    assert.ok(images.ok, images.out);
    assert.equal(images.out.trim().split("\n").length, 1, `only its base image: ${images.out}`);
    const snaps = await asVmm(uidOf(st), gidOf(st), ["ls", "-A", join(d.dataDir, "snapshots")], pid);
    assert.ok(!snaps.ok || snaps.out.trim() === "", `the snapshots are hidden: ${snaps.out}`);
    const r = await built;
    aliceContent = r.content;
    aliceSecret = (await sh("alice/t-alice", "cat /nonce /secret")).split("\n")[1] ?? "";
    assert.match(aliceSecret, /^[0-9a-f]{32}$/);
    assert.deepEqual(
      (await readdir(runDir)).filter((n) => n.startsWith("b-")),
      [],
      "nothing of the build VM is left in run/",
    );
  },
);

/** A process's command line. */
async function processArgs(pid: number): Promise<string[]> {
  return (await readFile(`/proc/${pid}/cmdline`, "utf8")).split("\0");
}

step("tenant B building A's Dockerfile gets its own value, and nothing of A's is cached for it", async () => {
  const b = await build("t-bob", tenantCtx, as("bob"));
  const all = b.messages.join("\n");
  assert.ok(!b.messages.some((m) => /^step \d+\/\d+: .*: cached$/.test(m)), all);
  assert.ok(!b.messages.some((m) => m.startsWith("build: every step cached")), all);
  assert.ok(
    b.messages.some((m) => m.startsWith("boot: starting the build VM")),
    all,
  );
  const bobSecret = (await sh("bob/t-bob", "cat /secret")).trim();
  assert.match(bobSecret, /^[0-9a-f]{32}$/);
  assert.notEqual(bobSecret, aliceSecret, "B ran the step itself");
  assert.notEqual(b.content, aliceContent);
});

step(
  "a tenant over its caps: 403 naming the cap before anything runs; a RUN past the build disk cap is stopped",
  async () => {
    const small = execFileSync("tar", ["-c", "-f", "-", "Dockerfile"], { cwd: tenantCtx });
    const refused = async (p: Promise<unknown>, cap: string) => {
      await assert.rejects(p, (e: unknown) => {
        assert.ok(e instanceof SdkError, String(e));
        assert.equal(e.status, 403, e.message);
        assert.equal(e.code, "forbidden");
        assert.match(e.message, new RegExp(`\\(${cap}\\)`));
        return true;
      });
    };
    await refused(as("alice").buildSnapshot({ tag: "t-big", memory_mib: 2048 }, small), "max_memory_mib");
    await refused(as("alice").buildSnapshot({ tag: "t-big", vcpus: 3 }, small), "max_vcpus");
    await refused(as("bob").createSnapshot({ tag: "t-big", memory_mib: 4096 }), "max_memory_mib");
    // Carol's token caps what her build's layers hold at 48 MiB; her RUN writes 128.
    const dir = await mkdtemp(join(tmpdir(), "forkd-df-disk-"));
    try {
      await writeFile(
        join(dir, "Dockerfile"),
        `FROM forkd://python\nARG NONCE\nRUN echo "$NONCE"; dd if=/dev/urandom of=/big bs=1M count=128 && sync\n`,
      );
      await assert.rejects(build("t-carol", dir, as("carol")), (e: unknown) => {
        assert.ok(e instanceof SdkError, String(e));
        assert.equal(e.code, "resource_exhausted", e.message);
        assert.match(e.message, /build disk cap of 48 MiB \(max_build_disk_mib\)/);
        return true;
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    const list = await api<{ snapshots: { tag: string }[] }>("GET", "/v1/snapshots");
    // The admin sees every tenant's tags by their namespaced names (docs/api.md, "Tags and namespaces").
    assert.ok(!list.snapshots.some((x) => /(^|\/)t-(big|carol)$/.test(x.tag)), JSON.stringify(list));
    assert.deepEqual(
      (await readdir(join(d.dataDir, "run"))).filter((n) => n.startsWith("b-")),
      [],
    );
  },
);
