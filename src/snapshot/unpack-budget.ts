/**
 * What an unpack may write, decided before each file's first byte: every file of a pack has
 * its size stated in the pack's manifest, and the whole pack may expand to at most the
 * configured limit (FORKD_UNPACK_MAX_MIB) and what the data directory has free (less a
 * margin). A file is admitted on the size its archive header states (a sparse member: its real
 * size), and the tar reader never delivers more than that; so a small archive that claims or
 * holds more than it may is refused before it is written, never after.
 *
 * Sizes are apparent sizes (holes count): a pack's files are hashed in full when verified, so
 * their apparent size is also what verification costs.
 */
import { ForkdError } from "../util/index.js";

export interface BudgetLimit {
  bytes: number;
  /** Why this is the bound: the configured limit, or the free space. */
  why: "limit" | "space";
}

/** FORKD_UNPACK_MAX_MIB in bytes (null: unset, free space is the bound); a bad value stops the daemon. */
export function unpackMaxFromEnv(env: NodeJS.ProcessEnv): number | null {
  const v = env.FORKD_UNPACK_MAX_MIB;
  if (v === undefined || v === "") return null;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1 || n > 2 ** 32) {
    throw new ForkdError(
      "invalid_argument",
      `FORKD_UNPACK_MAX_MIB must be an integer >= 1, not ${JSON.stringify(v)}`,
    );
  }
  return n * 2 ** 20;
}

/** The bound of one unpack or pull: FORKD_UNPACK_MAX_MIB (null: none) and free space less a margin. */
export function unpackLimit(
  configured: number | null,
  freeBytes: number | null,
  margin: number,
): BudgetLimit {
  const space = freeBytes === null ? Infinity : Math.max(0, freeBytes - margin);
  if (configured !== null && configured <= space) return { bytes: configured, why: "limit" };
  return { bytes: space, why: "space" };
}

/** The error for a pack of `bytes` (or more) past `limit`. */
export function overLimit(limit: BudgetLimit, bytes: number): ForkdError {
  return limit.why === "limit"
    ? new ForkdError(
        "payload_too_large",
        `the pack expands to more than the ${limit.bytes} bytes an unpack may write (FORKD_UNPACK_MAX_MIB)`,
        { limit_bytes: limit.bytes, needed_bytes: bytes },
      )
    : new ForkdError(
        "resource_exhausted",
        `the pack expands to more than the ${limit.bytes} bytes the data directory has free (less a margin)`,
        { free_bytes: limit.bytes, needed_bytes: bytes },
      );
}

export class UnpackBudget {
  private total = 0;
  /** Files admitted so far: path → size. */
  private readonly admitted = new Map<string, number>();
  private stated: Map<string, number> | null = null;

  /** `maxFileSize`: a bound for some paths whatever a manifest says (metadata files). */
  constructor(
    private readonly limit: BudgetLimit,
    private readonly maxFileSize: (path: string) => number = () => Infinity,
  ) {}

  /** Bytes admitted so far. */
  get bytes(): number {
    return this.total;
  }

  /** Admits `path` of `size` bytes, or refuses it before anything of it is written. */
  admit(path: string, size: number): void {
    if (this.admitted.has(path)) {
      throw new ForkdError("invalid_argument", `pack has two entries for ${path}`, { file: path });
    }
    if (size > this.maxFileSize(path)) {
      throw new ForkdError("invalid_argument", `pack file ${path} is too large (${size} bytes)`, {
        file: path,
      });
    }
    if (this.stated) this.checkStated(path, size);
    if (this.total + size > this.limit.bytes) throw overLimit(this.limit, this.total + size);
    this.total += size;
    this.admitted.set(path, size);
  }

  /**
   * The pack's manifest is known (`files`: every file but the manifest itself, of
   * `manifestSize` bytes): every file admitted so far and from now on must be listed with its
   * size, and their sum must fit the limit.
   */
  state(files: Record<string, { size: number }>, manifestPath: string, manifestSize: number): void {
    const stated = new Map<string, number>(Object.entries(files).map(([p, f]) => [p, f.size]));
    stated.set(manifestPath, manifestSize);
    const sum = [...stated.values()].reduce((a, b) => a + b, 0);
    if (sum > this.limit.bytes) throw overLimit(this.limit, sum);
    this.stated = stated;
    for (const [p, size] of this.admitted) this.checkStated(p, size);
  }

  private checkStated(path: string, size: number): void {
    const want = this.stated?.get(path);
    if (want === undefined) {
      throw new ForkdError("invalid_argument", `pack has a file its manifest does not list: ${path}`, {
        file: path,
      });
    }
    if (size !== want) {
      throw new ForkdError(
        "invalid_argument",
        `pack file ${path} is ${size} bytes; its manifest says ${want}`,
        {
          file: path,
        },
      );
    }
  }
}
