/** Image manifests, indexes and configs: parsed and bounded, the linux/amd64 entry picked, bad ones refused. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseImageConfig } from "../../src/oci/config.js";
import { MEDIA, layerCompression, parseManifestOrIndex, selectPlatform } from "../../src/oci/manifest.js";
import { ForkdError } from "../../src/util/errors.js";

const d = (c: string) => "sha256:" + c.repeat(64);
const j = (v: unknown) => Buffer.from(JSON.stringify(v));
const refused = (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument";

const manifest = (
  mediaType: string | undefined,
  layerType = "application/vnd.oci.image.layer.v1.tar+gzip",
) => ({
  schemaVersion: 2,
  ...(mediaType ? { mediaType } : {}),
  config: { mediaType: MEDIA.ociConfig, digest: d("a"), size: 10 },
  layers: [{ mediaType: layerType, digest: d("b"), size: 20 }],
});

test("manifests: OCI and Docker schema 2, by the body's media type or the Content-Type", () => {
  for (const mt of [MEDIA.ociManifest, MEDIA.dockerManifest]) {
    const p = parseManifestOrIndex(j(manifest(mt)), "", "t");
    assert.equal(p.kind, "manifest");
    const p2 = parseManifestOrIndex(j(manifest(undefined)), mt, "t");
    assert.equal(p2.kind, "manifest");
    if (p.kind === "manifest") assert.equal(p.manifest.layers[0]?.digest, d("b"));
  }
  // No media type anywhere (OCI makes it optional; a manifest read back from the cache has no
  // Content-Type): a config and layers make it a manifest.
  assert.equal(parseManifestOrIndex(j(manifest(undefined)), "", "t").kind, "manifest");
  // Schema 1 and unknown media types are refused.
  assert.throws(
    () =>
      parseManifestOrIndex(
        j({ schemaVersion: 1, name: "x", fsLayers: [] }),
        "application/vnd.docker.distribution.manifest.v1+prettyjws",
        "t",
      ),
    refused,
  );
  assert.throws(() => parseManifestOrIndex(j(manifest("application/x-other")), "", "t"), refused);
  assert.throws(() => parseManifestOrIndex(Buffer.from("not json"), MEDIA.ociManifest, "t"), refused);
  // A layer list past the bound, a bad digest.
  const many = {
    ...manifest(MEDIA.ociManifest),
    layers: Array.from({ length: 300 }, () => ({ mediaType: "x", digest: d("b"), size: 1 })),
  };
  assert.throws(() => parseManifestOrIndex(j(many), "", "t"), refused);
  const badDigest = {
    ...manifest(MEDIA.ociManifest),
    config: { mediaType: MEDIA.ociConfig, digest: "sha256:xyz", size: 1 },
  };
  assert.throws(() => parseManifestOrIndex(j(badDigest), "", "t"), refused);
});

test("indexes and manifest lists: linux/amd64 is picked, attestations and other platforms are not", () => {
  for (const [idxType, mType] of [
    [MEDIA.ociIndex, MEDIA.ociManifest],
    [MEDIA.dockerList, MEDIA.dockerManifest],
  ] as const) {
    const index = {
      schemaVersion: 2,
      mediaType: idxType,
      manifests: [
        {
          mediaType: mType,
          digest: d("1"),
          size: 5,
          platform: { os: "linux", architecture: "arm64", variant: "v8" },
        },
        { mediaType: mType, digest: d("2"), size: 6, platform: { os: "unknown", architecture: "unknown" } },
        { mediaType: mType, digest: d("3"), size: 7, platform: { os: "windows", architecture: "amd64" } },
        { mediaType: mType, digest: d("4"), size: 8, platform: { os: "linux", architecture: "amd64" } },
      ],
    };
    const p = parseManifestOrIndex(j(index), "", "t");
    assert.equal(p.kind, "index");
    if (p.kind !== "index") continue;
    assert.deepEqual(selectPlatform(p.index, "t"), { digest: d("4"), size: 8 });
    const arm = { ...p.index, manifests: p.index.manifests.slice(0, 3) };
    assert.throws(
      () => selectPlatform(arm, "t"),
      (e: unknown) => refused(e) && /no linux\/amd64 manifest \(has: linux\/arm64/.test((e as Error).message),
    );
  }
  // An index with no media type but a manifests list is an index.
  assert.equal(
    parseManifestOrIndex(j({ schemaVersion: 2, manifests: [] }), "application/json", "t").kind,
    "index",
  );
});

test("layer media types: gzip, zstd and plain tars; foreign layers refused", () => {
  assert.equal(layerCompression("application/vnd.oci.image.layer.v1.tar+gzip"), "gzip");
  assert.equal(layerCompression("application/vnd.oci.image.layer.v1.tar+zstd"), "zstd");
  assert.equal(layerCompression("application/vnd.oci.image.layer.v1.tar"), "none");
  assert.equal(layerCompression("application/vnd.docker.image.rootfs.diff.tar.gzip"), "gzip");
  assert.throws(() => layerCompression("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"), refused);
  assert.throws(
    () => layerCompression("application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"),
    refused,
  );
});

test("image config: Env, WorkingDir, User, Entrypoint, Cmd, Labels, diff_ids; bounded", () => {
  const cfg = {
    architecture: "amd64",
    os: "linux",
    config: {
      Env: ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "NOEQUALS"],
      WorkingDir: "/app",
      User: "1000:1000",
      Entrypoint: ["/entry.sh"],
      Cmd: ["serve", "--port", "80"],
      Labels: { a: "b" },
      ExposedPorts: { "80/tcp": {} },
    },
    rootfs: { type: "layers", diff_ids: [d("e"), d("f")] },
  };
  const p = parseImageConfig(j(cfg), "t");
  assert.deepEqual(p.config, {
    env: ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
    workingDir: "/app",
    user: "1000:1000",
    entrypoint: ["/entry.sh"],
    cmd: ["serve", "--port", "80"],
    labels: { a: "b" },
  });
  assert.deepEqual(p.diffIds, [d("e"), d("f")]);
  assert.deepEqual(p.platform, { os: "linux", architecture: "amd64" });
  // Absent and null fields are defaults.
  const bare = parseImageConfig(
    j({
      rootfs: { type: "layers", diff_ids: [] },
      config: { Env: null, Cmd: null, Labels: null, WorkingDir: "" },
    }),
    "t",
  );
  assert.deepEqual(bare.config, {
    env: [],
    workingDir: null,
    user: null,
    entrypoint: null,
    cmd: null,
    labels: {},
  });
  // Over the bounds, wrong types, no rootfs.
  assert.throws(
    () => parseImageConfig(j({ ...cfg, config: { Env: Array.from({ length: 5000 }, () => "A=1") } }), "t"),
    refused,
  );
  assert.throws(
    () => parseImageConfig(j({ ...cfg, config: { Env: ["A=" + "x".repeat(40 << 10)] } }), "t"),
    refused,
  );
  assert.throws(() => parseImageConfig(j({ ...cfg, config: { Cmd: "sh" } }), "t"), refused);
  assert.throws(() => parseImageConfig(j({ config: {} }), "t"), refused);
  assert.throws(() => parseImageConfig(Buffer.from("{"), "t"), refused);
});
