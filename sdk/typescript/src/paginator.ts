/**
 * E2B's SandboxPaginator over forkd's GET /v1/sandboxes (state, metadata, limit, next_token).
 * The filters are applied here as well, so a daemon that ignores them still answers right.
 * Awaiting the paginator itself reads every remaining page (an array, as Sandbox.list gave).
 */
import type { Transport } from "./transport.js";
import type { SandboxWire } from "./types.js";

export interface SandboxQuery {
  /** Pairs every listed sandbox has in its metadata. */
  metadata?: Record<string, string>;
  /** The states to list (default: all). */
  state?: Array<"running" | "paused" | "exited" | "lost">;
}

interface ListWire {
  sandboxes: SandboxWire[];
  next_token?: string | null;
}

export class SandboxPaginator<T> implements PromiseLike<T[]> {
  #hasNext = true;
  #nextToken: string | undefined;

  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly query: SandboxQuery,
    private readonly limit: number | undefined,
    nextToken: string | undefined,
    private readonly map: (w: SandboxWire) => T,
  ) {
    this.#nextToken = nextToken;
  }

  get hasNext(): boolean {
    return this.#hasNext;
  }

  get nextToken(): string | undefined {
    return this.#nextToken;
  }

  /** The next page. Throws when there is none (check hasNext). */
  async nextItems(): Promise<T[]> {
    if (!this.#hasNext) throw new Error("no more sandboxes: check hasNext first");
    const states = this.query.state ?? [];
    const meta = this.query.metadata ?? {};
    const r = await this.t.json<ListWire>("GET", "/v1/sandboxes", {
      query: {
        ...(states.length > 0 ? { state: states.join(",") } : {}),
        ...(Object.keys(meta).length > 0 ? { metadata: new URLSearchParams(meta).toString() } : {}),
        ...(this.limit !== undefined ? { limit: this.limit } : {}),
        ...(this.#nextToken ? { next_token: this.#nextToken } : {}),
      },
    });
    this.#nextToken = r.next_token ?? undefined;
    this.#hasNext = Boolean(r.next_token);
    return r.sandboxes
      .filter((w) => states.length === 0 || states.includes(w.state))
      .filter((w) => Object.entries(meta).every(([k, v]) => w.metadata[k] === v))
      .map(this.map);
  }

  /** Every remaining page. */
  async all(): Promise<T[]> {
    const out: T[] = [];
    while (this.#hasNext) out.push(...(await this.nextItems()));
    return out;
  }

  then<A = T[], B = never>(
    onFulfilled?: ((v: T[]) => A | PromiseLike<A>) | null,
    onRejected?: ((e: unknown) => B | PromiseLike<B>) | null,
  ): PromiseLike<A | B> {
    return this.all().then(onFulfilled, onRejected);
  }
}
