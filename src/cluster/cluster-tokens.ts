/**
 * The cluster's API tokens, a TokenBacking (src/access/token-entry.ts) in etcd: `tokens/<id>`
 * holds one token's entry (its sha256, tenant, scope, limits; never the token). Every node and
 * gateway follows the prefix (a mirror: list, then watch), so a token created through any of
 * them authenticates everywhere as soon as the watch tells it (milliseconds), and a revoked one
 * stops everywhere the same way, ending what it opened on every member (TokenStore.set). A
 * bearer a member does not know makes it catch up first (catchUp: etcd's revision now, the
 * mirror waited for), so a token made a moment ago through another member works at once.
 * Creation is create-only on the id; entries that do not parse are left out (and logged).
 */
import { MAX_TOKENS, TokenEntry, checkUnique } from "../access/index.js";
import type { TokenBacking } from "../access/index.js";
import { PrefixMirror } from "../etcd/index.js";
import type { Kv } from "../etcd/index.js";
import { ForkdError, sleep } from "../util/index.js";
import type { ClusterKeys } from "./keys.js";
import { parseRecord } from "./records.js";

/** Tries of a token's creation when etcd cannot say whether it was written (an election). */
const ADD_ATTEMPTS = 3;
/** A catch-up's wait for the mirror (then the caller goes on with what is known). */
const CATCH_UP_MS = 2_000;
/** Catch-ups start at most this often (however many unknown bearers arrive). */
const CATCH_UP_EVERY_MS = 200;

export class ClusterTokens implements TokenBacking {
  private readonly mirror: PrefixMirror<TokenEntry>;
  /** The next catch-up, shared by every caller waiting for it. */
  private next: Promise<void> | null = null;
  private lastStart = 0;
  private started: Promise<void> | null = null;
  private readonly followers: ((entries: TokenEntry[]) => void)[] = [];

  constructor(
    private readonly kv: Kv,
    private readonly keys: ClusterKeys,
    onProblem: (what: string) => void = () => undefined,
  ) {
    this.mirror = new PrefixMirror<TokenEntry>({
      kv,
      prefix: keys.tokens,
      parse: (key, raw) => {
        const e = parseRecord(TokenEntry, raw);
        return e && key === keys.token(e.id) ? e : null;
      },
      onChange: () => {
        const all = this.entries();
        for (const f of this.followers) f(all);
      },
      onProblem,
    });
  }

  get where(): string {
    return `the cluster's tokens (etcd ${this.keys.tokens})`;
  }

  private entries(): TokenEntry[] {
    // Two entries with one hash (written by hand into etcd): neither is trusted.
    const all = [...this.mirror.values()];
    const seen = new Map<string, number>();
    for (const e of all) seen.set(e.sha256, (seen.get(e.sha256) ?? 0) + 1);
    return all.filter((e) => seen.get(e.sha256) === 1);
  }

  async load(): Promise<TokenEntry[]> {
    this.started ??= this.mirror.start();
    await this.started;
    const all = this.entries();
    checkUnique(all, this.where);
    return all;
  }

  /**
   * Reads etcd's revision now and waits for the mirror to reach it: every token made or revoked
   * before the call is then known here. Shared by concurrent callers; one starts at most every
   * CATCH_UP_EVERY_MS (an unknown bearer cannot make a member read etcd at its own rate).
   */
  catchUp(): Promise<void> {
    this.next ??= (async () => {
      const wait = this.lastStart + CATCH_UP_EVERY_MS - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      this.next = null; // who comes from now on waits for the next round
      this.lastStart = Date.now();
      try {
        const { revision } = await this.kv.list(this.keys.tokens, 1);
        await this.mirror.caughtUp(revision, CATCH_UP_MS);
      } catch {
        // etcd unreachable: what is known here is all there is.
      }
    })();
    return this.next;
  }

  follow(onEntries: (entries: TokenEntry[]) => void): void {
    this.followers.push(onEntries);
  }

  async add(entry: TokenEntry): Promise<void> {
    if ((await this.kv.count(this.keys.tokens)) >= MAX_TOKENS)
      throw new ForkdError("resource_exhausted", `at most ${MAX_TOKENS} tokens`);
    const key = this.keys.token(entry.id);
    const value = JSON.stringify(entry);
    // Create-only, tried again when etcd could not say (an election): a retry that finds the
    // entry already there with this very value is this write, applied the first time.
    for (let attempt = 1; ; attempt++) {
      let r: { succeeded: boolean; revision: number };
      try {
        r = await this.kv.txn(
          [{ key, target: "version", op: "==", value: 0 }],
          [{ type: "put", key, value }],
        );
      } catch (e) {
        if (attempt >= ADD_ATTEMPTS) throw e;
        await sleep(300 * attempt);
        continue;
      }
      if (!r.succeeded) {
        const cur = attempt > 1 ? await this.kv.get(key) : null;
        if (cur?.value !== value) throw new ForkdError("conflict", `token id ${entry.id} exists already`);
        r = { succeeded: true, revision: cur.modRevision };
      }
      await this.mirror.caughtUp(r.revision, 5000);
      return;
    }
  }

  async remove(entry: TokenEntry): Promise<void> {
    const key = this.keys.token(entry.id);
    const r = await this.kv.txn([{ key, target: "version", op: ">", value: 0 }], [{ type: "delete", key }]);
    if (!r.succeeded) throw new ForkdError("not_found", `no token ${entry.id}`, { id: entry.id });
    await this.mirror.caughtUp(r.revision, 5000);
  }

  async close(): Promise<void> {
    await this.mirror.close();
  }
}
