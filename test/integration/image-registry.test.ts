/**
 * A snapshot from an image in a registry, end to end with the OCI puller: the debootstrap tree
 * pushed as an OCI image (test/helpers/oci-images.ts) with an Env and a WorkingDir to a
 * loopback registry (Debian's docker-registry), snapshotted with a start command that serves
 * HTTP and a ready command; a forked child finds the server up and the source recorded; a
 * second snapshot of the same image by digest builds nothing (the same guest image).
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { api, forkOne, sh } from "../helpers/vm.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { rawRequest, readAll } from "../helpers/http.js";
import { debootstrapLayer, pushImage } from "../helpers/oci-images.js";
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

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-imgreg-"));
  reg = await startRegistry(work);
  const layer = await debootstrapLayer(CACHE);
  assert.ok(layer, `no python debootstrap stage under ${CACHE}/stages: build the python template first`);
  img = await pushImage(reg.host, "forkd-test/debian-snap", "v1", [layer], {
    config: { Env: ENV, WorkingDir: "/tmp", Cmd: ["bash"] },
  });
  d = await makeDaemon({ FORKD_POOL_SIZE: "0" });
});

after(async () => {
  await d?.destroy(failed());
  await reg?.stop();
  await rm(work, { recursive: true, force: true });
});

async function createStreamed(body: unknown): Promise<{ messages: string[]; last: Record<string, unknown> }> {
  const res = await rawRequest(d!.ep, "POST", "/v1/snapshots?stream=1", JSON.stringify(body), 1_800_000, {
    "content-type": "application/json",
  });
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

step("a snapshot from a registry image: pulled, its server started and waited for", async () => {
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
});

step("a forked child of it has the server up, started with the image's Env and WorkingDir", async () => {
  const id = await forkOne(d!, "reg");
  assert.equal(await sh(d!, id, GET("/debian_version")), await sh(d!, id, "cat /etc/debian_version"));
  assert.match(await sh(d!, id, "cat /tmp/start-env"), /^GREETING=from the registry$/m);
  assert.equal((await sh(d!, id, "cat /tmp/start-cwd")).trim(), "/tmp");
  assert.equal(await sh(d!, id, "[ -e /sbin/forkd-agent ] || echo absent"), "absent\n");
  await api(d!, "DELETE", `/v1/sandboxes/${id}`);
});

step("a second snapshot of the same image, by digest, builds nothing: the same guest image", async () => {
  const r = await createStreamed({ tag: "reg2", image: img.refByDigest, memory_mib: 256 });
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
});
