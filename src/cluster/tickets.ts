/**
 * Console tickets used once, across gateways: a ticket's first use writes
 * console-tickets/<sha256 of the ticket> (its expiry, ms) in a transaction that holds only if
 * the key does not exist, so a second use anywhere fails. Used keys are swept once their ticket
 * has expired (it could not be used again anyway).
 */
import { createHash } from "node:crypto";
import type { Kv } from "../etcd/index.js";
import type { ClusterKeys } from "./keys.js";

export class UsedTickets {
  constructor(
    private readonly kv: Kv,
    private readonly keys: ClusterKeys,
  ) {}

  /** True the first time `ticket` is used (in the whole cluster), false after. */
  async use(ticket: string, expiresAt: number): Promise<boolean> {
    const key = this.keys.consoleTicket(createHash("sha256").update(ticket, "utf8").digest("hex"));
    const t = await this.kv.txn(
      [{ key, target: "version", op: "==", value: 0 }],
      [{ type: "put", key, value: String(expiresAt) }],
    );
    return t.succeeded;
  }

  /** Drops the keys of expired tickets; resolves to how many went. */
  async sweep(now = Date.now()): Promise<number> {
    let n = 0;
    for (const e of (await this.kv.list(this.keys.consoleTickets)).entries) {
      const at = Number(e.value);
      if (Number.isFinite(at) && at > now) continue;
      const t = await this.kv.txn(
        [{ key: e.key, target: "mod", op: "==", value: e.modRevision }],
        [{ type: "delete", key: e.key }],
      );
      if (t.succeeded) n++;
    }
    return n;
  }
}
