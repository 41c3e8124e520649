/**
 * Snapshots as the API serves them: the one place a snapshot's metadata (meta.json, which keeps
 * its own shape and format version: docs/snapshot-format.md) and a pending write's record become
 * wire views (snake_case, src/api/contract/schemas.ts). Every reply, stream event and result that
 * holds a snapshot goes through here. Tags are store keys until `names` (the caller's: src/app/scope.ts
 * tagNames) shows them as the caller writes them.
 */
import type { z } from "zod";
import type { SnapshotMeta } from "../../snapshot/index.js";
import type { SnapshotPending } from "../../snapshot/index.js";
import { ERROR_CODES } from "../../util/index.js";
import type { ErrorCode } from "../../util/index.js";
import type { Snapshot, SnapshotStatus } from "../contract/schemas.js";

export type SnapshotView = z.infer<typeof Snapshot>;
export type SnapshotStatusView = z.infer<typeof SnapshotStatus>;

const asKey = (key: string): string => key;

/** A ready snapshot's metadata as served. Optional parts stay absent when the metadata has none. */
export function snapshotView(m: SnapshotMeta, names: (key: string) => string = asKey): SnapshotView {
  return {
    format: m.format,
    tag: names(m.tag),
    template: m.template,
    source:
      m.source.kind === "template"
        ? { kind: "template", name: m.source.name }
        : m.source.kind === "image"
          ? { kind: "image", ref: m.source.ref, digest: m.source.digest }
          : m.source,
    created: m.created,
    status: m.status,
    machine: {
      memory_mib: m.machine.memoryMiB,
      vcpus: m.machine.vcpus,
      accel: m.machine.accel,
      cpu: m.machine.cpu,
    },
    image: {
      hash: m.image.hash,
      dir: m.image.dir,
      kernel_version: m.image.kernelVersion,
      ...(m.image.content !== undefined ? { content: m.image.content } : {}),
    },
    qemu: { binary: m.qemu.binary, version: m.qemu.version },
    warm: m.warm,
    warm_eval: m.warmEval,
    warm_eval_language: m.warmEval === null ? null : (m.warmEvalLanguage ?? "python"),
    disk_size: m.diskSize,
    files: {
      memory: { size: m.files.memory.size, sha256: m.files.memory.sha256 },
      vmstate: { size: m.files.vmstate.size, sha256: m.files.vmstate.sha256 },
      disk: { size: m.files.disk.size, sha256: m.files.disk.sha256 },
      ...(m.files.memoryDiff
        ? { memory_diff: { size: m.files.memoryDiff.size, sha256: m.files.memoryDiff.sha256 } }
        : {}),
    },
    timings: { boot_ms: m.timings.bootMs, warm_ms: m.timings.warmMs, freeze_ms: m.timings.freezeMs },
    ...(m.stateFormat !== undefined ? { state_format: m.stateFormat } : {}),
    ...(m.parent !== undefined
      ? { parent: m.parent && { tag: names(m.parent.tag), checksum: m.parent.checksum } }
      : {}),
    ...(m.memoryBase !== undefined
      ? { memory_base: { tag: names(m.memoryBase.tag), checksum: m.memoryBase.checksum } }
      : {}),
    ...(m.branch !== undefined
      ? {
          branch: {
            sandbox: m.branch.sandbox,
            pause_ms: m.branch.pauseMs,
            private_bytes: m.branch.privateBytes,
            finish_ms: m.branch.finishMs,
          },
        }
      : {}),
    ...(m.owner !== undefined ? { owner: m.owner } : {}),
    ...(m.nic !== undefined
      ? {
          nic: {
            mac: m.nic.mac,
            addr: m.nic.addr,
            prefix: m.nic.prefix,
            gateway: m.nic.gateway,
            dns: m.nic.dns,
            gateway_mac: m.nic.gatewayMac,
            link_up: m.nic.linkUp,
          },
        }
      : {}),
    checksum: m.checksum,
  };
}

const isErrorCode = (c: string): c is ErrorCode => (ERROR_CODES as readonly string[]).includes(c);

/** A snapshot being written, or failed. A stored code this daemon does not know reads `internal`. */
export function snapshotStatusView(
  p: SnapshotPending,
  names: (key: string) => string = asKey,
): SnapshotStatusView {
  return {
    tag: names(p.tag),
    status: p.status,
    started: p.started,
    source: p.source,
    error: p.error && {
      code: isErrorCode(p.error.code) ? p.error.code : "internal",
      message: p.error.message,
    },
    ...(p.owner !== undefined ? { owner: p.owner } : {}),
  };
}
