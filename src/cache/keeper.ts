/**
 * A daemon's part in keeping the shared cache: it records its data directory as a user of the
 * cache (users.ts), pins what its operations in progress use (pins.ts), and, with a budget
 * (FORKD_CACHE_MAX_GIB), collects the cache down to it at start and after each build: least
 * recently used entries nothing keeps first, never one a snapshot of a live data directory
 * names. One collection at a time; one that finds an image build running is skipped (the next
 * build's collection runs after it). A collection's failure is logged, never the daemon's.
 */
import { ForkdError, errorMessage } from "../util/index.js";
import type { Logger } from "../util/index.js";
import { collect, DEFAULT_GRACE_MS } from "./collect.js";
import { CachePins } from "./pins.js";
import type { PinScope } from "./pins.js";
import { registerUser } from "./users.js";

export interface CacheSettings {
  /** FORKD_CACHE_MAX_GIB in bytes; null: no automatic collection. */
  budgetBytes: number | null;
  /** FORKD_CACHE_GRACE_S in ms: entries used more recently stay (default 30 min). */
  graceMs: number;
}

export function cacheSettingsFromEnv(env: NodeJS.ProcessEnv): CacheSettings {
  const num = (name: string): number | null => {
    const v = env[name];
    if (v === undefined || v === "") return null;
    const n = Number(v);
    if (!Number.isFinite(n) || n < 0)
      throw new ForkdError("invalid_argument", `${name}: not a number >= 0: ${v}`);
    return n;
  };
  const gib = num("FORKD_CACHE_MAX_GIB");
  const grace = num("FORKD_CACHE_GRACE_S");
  return {
    budgetBytes: gib === null ? null : Math.floor(gib * 1024 ** 3),
    graceMs: grace === null ? DEFAULT_GRACE_MS : grace * 1000,
  };
}

export class CacheKeeper {
  readonly pins: CachePins;
  private running: Promise<void> | null = null;
  private again = false;
  private closed = false;

  constructor(
    readonly cacheDir: string,
    readonly dataDir: string,
    private readonly settings: CacheSettings,
    private readonly log: Logger,
  ) {
    this.pins = new CachePins(cacheDir, dataDir);
  }

  /** Records this daemon's data directory as a user of the cache, then collects once (budget). */
  async start(): Promise<void> {
    // Not recorded (a read-only cache): its snapshots are still found while it runs (its
    // process names its data directory: live-daemons.ts), so this is a warning, not a failure.
    await registerUser(this.cacheDir, this.dataDir).catch((e: unknown) =>
      this.log.warn("data directory not recorded as a user of the cache", { error: errorMessage(e) }),
    );
    this.collectSoon();
  }

  scope(): PinScope {
    return this.pins.scope();
  }

  /** After a build: collects down to the budget (in the background; coalesced). */
  collectSoon(): void {
    if (this.settings.budgetBytes === null || this.closed) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.run().finally(() => {
      this.running = null;
      if (this.again && !this.closed) {
        this.again = false;
        this.collectSoon();
      }
    });
  }

  /** Waits for a collection in progress (the daemon is stopping). */
  async close(): Promise<void> {
    this.closed = true;
    await this.running;
  }

  /** Resolves when the collections asked for so far have run (tests). */
  async idle(): Promise<void> {
    while (this.running) await this.running;
  }

  private async run(): Promise<void> {
    try {
      const r = await collect(this.cacheDir, {
        dryRun: false,
        budgetBytes: this.settings.budgetBytes,
        graceMs: this.settings.graceMs,
        dataDirs: [this.dataDir],
        waitMs: 0,
      });
      if (r.busy) return this.log.info("cache collection skipped", { reason: r.busy });
      if (r.evict.length > 0 || r.afterBytes > (this.settings.budgetBytes ?? 0)) {
        this.log.info("cache collected", {
          evicted: r.evict.map((e) => e.id),
          freed_bytes: r.freedBytes,
          cache_bytes: r.afterBytes,
          budget_bytes: this.settings.budgetBytes,
        });
      }
    } catch (e) {
      this.log.warn("cache collection failed", { error: errorMessage(e) });
    }
  }
}
