/**
 * Per-tenant sandbox quota (a token's `max_sandboxes`): what a tenant holds (running or paused)
 * plus what its forks in flight may add. The forks in flight are reserved here, so two
 * concurrent forks cannot both pass the check.
 */
import { ForkdError } from "../util/index.js";
import type { Caller } from "./caller.js";

export class SandboxQuota {
  private readonly reserved = new Map<string, number>();

  /** Reserves `n` sandboxes for the caller's tenant (or throws 429); call the result when done. */
  reserve(caller: Caller, n: number, held: () => number): () => void {
    const tenant = caller.tenant;
    const max = caller.maxSandboxes;
    if (tenant === null || max === null) return () => undefined;
    const pending = this.reserved.get(tenant) ?? 0;
    const existing = held() + pending;
    if (existing + n > max) {
      throw new ForkdError(
        "resource_exhausted",
        `forking ${n} would exceed this tenant's limit of ${max} sandboxes (${existing} held or starting)`,
        { limit: max, existing },
      );
    }
    this.reserved.set(tenant, pending + n);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const left = (this.reserved.get(tenant) ?? n) - n;
      if (left > 0) this.reserved.set(tenant, left);
      else this.reserved.delete(tenant);
    };
  }
}
