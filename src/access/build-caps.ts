/**
 * Per-tenant caps on what the daemon builds for a tenant: the memory and vCPUs of a VM it boots
 * to make a snapshot (POST /v1/snapshots and /v1/snapshots/build: the parent VM, the Dockerfile
 * build VM, and so every child of the snapshot), and what one Dockerfile build's step layers may
 * hold on the host's disk. The operator sets the defaults (FORKD_TENANT_MAX_MEMORY_MIB,
 * FORKD_TENANT_MAX_VCPUS, FORKD_TENANT_MAX_BUILD_DISK_MIB: src/daemon/config.ts); an admin may
 * give a token caps of its own (max_memory_mib, max_vcpus, max_build_disk_mib: tokens.ts).
 * Admins have none beyond the API's own bounds. A request over a cap is refused (403, naming
 * the cap) before anything is done.
 */
import { ForkdError } from "../util/index.js";
import type { BuildCaps, Caller } from "./caller.js";

/** The defaults when the operator sets none. */
export const DEFAULT_BUILD_CAPS: BuildCaps = { memoryMiB: 4096, vcpus: 4, buildDiskMiB: 16384 };

/** The caps of `caller` (its token's own, else the operator's); null: an admin, none. */
export function buildCapsOf(caller: Caller, defaults: BuildCaps): BuildCaps | null {
  if (caller.tenant === null) return null;
  return {
    memoryMiB: caller.caps?.memoryMiB ?? defaults.memoryMiB,
    vcpus: caller.caps?.vcpus ?? defaults.vcpus,
    buildDiskMiB: caller.caps?.buildDiskMiB ?? defaults.buildDiskMiB,
  };
}

/** Refuses (403, naming the cap) a VM larger than `caps` allow; null caps: anything. */
export function checkBuildSize(caps: BuildCaps | null, asked: { memoryMiB: number; vcpus: number }): void {
  if (!caps) return;
  if (asked.memoryMiB > caps.memoryMiB)
    throw new ForkdError(
      "forbidden",
      `memory_mib ${asked.memoryMiB} is over this tenant's cap of ${caps.memoryMiB} MiB (max_memory_mib)`,
      { field: "memory_mib", cap: "max_memory_mib", limit: caps.memoryMiB },
    );
  if (asked.vcpus > caps.vcpus)
    throw new ForkdError(
      "forbidden",
      `vcpus ${asked.vcpus} is over this tenant's cap of ${caps.vcpus} (max_vcpus)`,
      { field: "vcpus", cap: "max_vcpus", limit: caps.vcpus },
    );
}
