/**
 * A snapshot from an image in a registry, end to end with the OCI puller: the debootstrap tree,
 * its /dev device nodes included, pushed as an OCI image (test/helpers/oci-images.ts) with an Env
 * and a WorkingDir to a loopback registry (Debian's docker-registry), snapshotted with a start
 * command that serves HTTP and a ready command: the device nodes are skipped and counted in the
 * progress; a forked child finds the server up, the source recorded and its /dev working (the
 * guest's devtmpfs). A tenant (a token on the daemon's TCP listener) is refused that loopback
 * registry, as an image and as a Dockerfile's FROM (403, nothing made); a second snapshot of
 * the same image by digest, by the tenant through the name the operator allows
 * (FORKD_TENANT_REGISTRIES), builds nothing (the same guest image).
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { api, forkOne, sh } from "../helpers/vm.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { rawRequest, readAll } from "../helpers/http.js";
import type { Endpoint } from "../helpers/http.js";
import { debootstrapLayer, makeTar, pushImage } from "../helpers/oci-images.js";
import { freePort } from "../helpers/port.js";
import type { PushedImage } from "../helpers/oci-images.js";
import { startRegistry } from "../helpers/registry.js";
import type { TestRegistry } from "../helpers/registry.js";
import { steps } from "../helpers/steps.js";

const { step, failed } = steps();
const CACHE = process.env.FORKD_CACHE_DIR ?? "/var/cache/forkd";
const ENV = [
  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  "GREETING=from the registry",
];
let work: string;
let reg: TestRegistry | undefined;
let d: TestDaemon | undefined;
let img: PushedImage;
/** Device nodes in the layer (debootstrap's /dev). */
let devices = 0;
/** The daemon's TCP listener, where a tenant calls with its token. */
let tcp = "";
let tenant = "";

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-imgreg-"));
  reg = await startRegistry(work);
  const layer = await debootstrapLayer(CACHE, { devNodes: true });
  devices = Number(
    execFileSync(
      "bash",
      ["-c", `set -o pipefail; zstd -dcq "$1" | tar -tvf - | grep -c '^[cb]'`, "bash", layer.file],
      {
        encoding: "utf8",
      },
    ).trim(),
  );
  assert.ok(devices > 0, "the debootstrap tree has its /dev nodes");
  img = await pushImage(reg.host, "forkd-test/debian-snap", "v1", [layer], {
    config: { Env: ENV, WorkingDir: "/tmp", Cmd: ["bash"] },
  });
  const port = await freePort();
  tcp = `http://127.0.0.1:${port}`;
  d = await makeDaemon({
    FORKD_POOL_SIZE: "0",
    FORKD_LISTEN: `127.0.0.1:${port}`,
    // The operator allows the test registry to tenants by this name only.
    FORKD_TENANT_REGISTRIES: `localhost:${reg.host.split(":")[1] ?? ""}`,
  });
  const t = await cli(d, ["token", "create", "--tenant", "alice"]);
  assert.equal(t.code, 0, t.stderr);
  tenant = t.stdout.trim();
});

after(async () => {
  await d?.destroy(failed());
  await reg?.stop();
  await rm(work, { recursive: true, force: true });
});

async function createStreamed(
  body: unknown,
  ep: Endpoint = d!.ep,
): Promise<{ messages: string[]; last: Record<string, unknown> }> {
  const res = await rawRequest(ep, "POST", "/v1/snapshots?stream=1", JSON.stringify(body), 1_800_000, {
    "content-type": "application/json",
  });
  assert.equal(res.statusCode, 201);
  const events = (await readAll(res))
    .toString("utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  return {
    messages: events.filter((e) => e.type === "progress").map((e) => String(e.message)),
    last: events[events.length - 1] ?? {},
  };
}

const GET = (path: string) =>
  `python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080${path}', timeout=10).read().decode(), end='')"`;
let imageDir = "";

/** A tenant's call on the TCP listener: its status and error. */
async function asTenant(
  path: string,
  body: string | Buffer,
  type: string,
): Promise<{ status: number; error?: { code: string; message: string } }> {
  const res = await rawRequest({ url: tcp, token: tenant }, "POST", path, body, 600_000, {
    "content-type": type,
  });
  const j = JSON.parse((await readAll(res)).toString("utf8")) as {
    error?: { code: string; message: string };
  };
  return { status: res.statusCode ?? 0, ...(j.error ? { error: j.error } : {}) };
}

step(
  "a snapshot from a registry image with device nodes: pulled (the nodes skipped), its server started",
  async () => {
    const r = await createStreamed({
      tag: "reg",
      image: img.ref,
      memory_mib: 384,
      start_cmd:
        "env > /tmp/start-env; pwd > /tmp/start-cwd; exec python3 -m http.server 8080 --bind 127.0.0.1 --directory /etc",
      ready_cmd: `python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/', timeout=2)"`,
    });
    assert.equal(r.last.type, "done", JSON.stringify(r.last));
    const snap = r.last.snapshot as { source: unknown; image: { dir: string } };
    assert.deepEqual(snap.source, { kind: "image", ref: img.ref, digest: img.digest });
    imageDir = snap.image.dir;
    // Told when the tree is flattened (a tree an earlier run on this host cached is not again;
    // the next step checks the guest's /dev either way).
    if (r.messages.includes("flattened"))
      assert.ok(
        r.messages.some((m) => m.startsWith(`skipped ${devices} device nodes `)),
        r.messages.filter((m) => /device|flatten/.test(m)).join("\n"),
      );
  },
);

step("a forked child of it has the server up, started with the image's Env and WorkingDir", async () => {
  const id = await forkOne(d!, "reg");
  assert.equal(await sh(d!, id, GET("/debian_version")), await sh(d!, id, "cat /etc/debian_version"));
  assert.match(await sh(d!, id, "cat /tmp/start-env"), /^GREETING=from the registry$/m);
  assert.equal((await sh(d!, id, "cat /tmp/start-cwd")).trim(), "/tmp");
  assert.equal(await sh(d!, id, "[ -e /sbin/forkd-agent ] || echo absent"), "absent\n");
  // The image's /dev nodes were not made; the guest's own devtmpfs has them.
  assert.equal(
    await sh(
      d!,
      id,
      "test -c /dev/null && test -c /dev/full && head -c 3 /dev/zero | wc -c; echo x > /dev/full || echo full",
    ),
    "3\nfull\n",
  );
  await api(d!, "DELETE", `/v1/sandboxes/${id}`);
});

step("a tenant is refused the loopback registry (403, nothing made), as an image and as a FROM", async () => {
  for (const stream of ["", "?stream=1"]) {
    const r = await asTenant(
      `/v1/snapshots${stream}`,
      JSON.stringify({ tag: "t-loop", image: img.ref, memory_mib: 256 }),
      "application/json",
    );
    assert.equal(r.status, 403, JSON.stringify(r));
    assert.equal(r.error?.code, "forbidden");
    assert.match(
      r.error?.message ?? "",
      new RegExp(`refusing ${reg!.host}: a tenant's image may come only from`),
    );
  }
  const context = makeTar([{ name: "Dockerfile", data: `FROM ${img.ref}\nRUN true\n` }]);
  const b = await asTenant("/v1/snapshots/build?tag=t-from", context, "application/x-tar");
  assert.equal(b.status, 403, JSON.stringify(b));
  assert.equal(b.error?.code, "forbidden");
  const { snapshots } = await api<{ snapshots: { tag: string }[] }>(d!, "GET", "/v1/snapshots");
  assert.deepEqual(
    snapshots.map((x) => x.tag).filter((t) => t.startsWith("t-")),
    [],
  );
});

step(
  "a tenant's snapshot of it by digest, through the name the operator allows, builds nothing",
  async () => {
    const viaName = img.refByDigest.replace(/^127\.0\.0\.1:/, "localhost:");
    assert.notEqual(viaName, img.refByDigest);
    const r = await createStreamed(
      { tag: "reg2", image: viaName, memory_mib: 256 },
      { url: tcp, token: tenant },
    );
    assert.equal(r.last.type, "done", JSON.stringify(r.last));
    const snap = r.last.snapshot as { source: { digest: string }; image: { dir: string } };
    assert.equal(snap.source.digest, img.digest);
    assert.equal(snap.image.dir, imageDir);
    const built = r.messages.filter((m) => m.startsWith("DONE ") && !m.startsWith("DONE agent "));
    assert.ok(built.length > 0, r.messages.join("\n"));
    assert.deepEqual(
      built.filter((m) => !m.endsWith(" cached")),
      [],
      built.join(" | "),
    );
  },
);
