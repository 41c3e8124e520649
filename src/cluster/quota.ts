/**
 * A tenant's sandbox quota across the cluster (a token's max_sandboxes; docs/cluster.md,
 * "Placement"): what the tenant holds (its by-owner/<tenant>/ keys, which nodes write for every
 * running or paused sandbox before a fork answers) plus what forks in flight may add (its
 * reservations/<tenant>/ keys, each under the lease of the gateway that made it), checked and
 * reserved by compare-and-swap: the reservation is written in one transaction with a change of
 * the tenant's guard key (quota/<tenant>) that holds only if the guard is still at the revision
 * read before the count. Two gateways admitting the same tenant at once cannot both pass on the
 * same count: the second's transaction fails and it counts again. The bound: held + reserved
 * never exceeds max_sandboxes through gateways; between a node writing its children's keys and
 * the gateway dropping its reservation they count twice (a refusal may come early, never
 * late); a gateway that dies mid-fork loses its reservations with its lease while the node's
 * keys stay. A node called directly applies only its own count of the tenant's sandboxes.
 */
import { randomBytes } from "node:crypto";
import type { Kv, KvLease } from "../etcd/index.js";
import { ForkdError } from "../util/index.js";
import type { ClusterKeys } from "./keys.js";

export interface QuotaOptions {
  kv: Kv;
  keys: ClusterKeys;
  /** The lease reservations live under (the gateway's own, kept alive while it runs). */
  lease: () => Promise<KvLease>;
  /** Transactions tried before a busy tenant's admission gives up (503). */
  attempts?: number;
}

/** A reservation made: release() drops it (idempotent, never throws). */
export interface Reservation {
  release(): Promise<void>;
}

const NOTHING: Reservation = { release: async () => undefined };

export class ClusterQuota {
  constructor(private readonly o: QuotaOptions) {}

  /** What tenant `tenant` holds and has reserved now. */
  async usage(tenant: string): Promise<{ held: number; reserved: number; guard: number }> {
    const k = this.o.keys;
    const guard = await this.o.kv.get(k.quotaGuard(tenant));
    const [held, reserved] = await Promise.all([
      this.o.kv.count(k.byOwner(tenant)),
      this.o.kv.list(k.reservations(tenant)).then((r) =>
        r.entries.reduce((sum, e) => {
          const n = Number(e.value);
          return sum + (Number.isSafeInteger(n) && n > 0 ? n : 0);
        }, 0),
      ),
    ]);
    return { held, reserved, guard: guard?.modRevision ?? 0 };
  }

  /**
   * Reserves `n` sandboxes for `tenant` (null: an admin, no quota) under `max` (null: none), or
   * throws resource_exhausted (429) past it.
   */
  async reserve(tenant: string | null, max: number | null, n: number): Promise<Reservation> {
    if (tenant === null || max === null) return NOTHING;
    const k = this.o.keys;
    const attempts = this.o.attempts ?? 20;
    for (let i = 0; i < attempts; i++) {
      const u = await this.usage(tenant);
      const existing = u.held + u.reserved;
      if (existing + n > max)
        throw new ForkdError(
          "resource_exhausted",
          `forking ${n} would exceed this tenant's limit of ${max} sandboxes (${existing} held or starting in the cluster)`,
          { limit: max, existing },
        );
      const lease = await this.o.lease();
      const key = k.reservation(tenant, randomBytes(8).toString("hex"));
      const guard = k.quotaGuard(tenant);
      const t = await this.o.kv.txn(
        [
          u.guard === 0
            ? { key: guard, target: "version", op: "==", value: 0 }
            : { key: guard, target: "mod", op: "==", value: u.guard },
        ],
        [
          { type: "put", key: guard, value: String(Date.now()) },
          { type: "put", key, value: String(n), lease: lease.id },
        ],
      );
      if (t.succeeded) {
        let done = false;
        return {
          release: async () => {
            if (done) return;
            done = true;
            // Retried a few times: a reservation left behind counts until the gateway's lease ends.
            for (let a = 0; a < 5; a++) {
              if (
                await this.o.kv.delete(key).then(
                  () => true,
                  () => false,
                )
              )
                return;
              await new Promise((r) => setTimeout(r, 200 << a));
            }
          },
        };
      }
      // Another gateway admitted this tenant meanwhile: count again, after a short random pause.
      await new Promise((r) => setTimeout(r, Math.floor(Math.random() * (5 + 5 * i))));
    }
    throw new ForkdError("unavailable", `tenant ${tenant}'s admissions are too busy; retry`, {
      retry_after_s: 1,
    });
  }
}
