/**
 * How large a sandbox's record may be (MAX_RECORD, what recovery reads) and what the APIs let a
 * sandbox hold so that its record always fits (RECORD_BUDGET). No imports: the API's contract
 * reads it.
 */

/** The largest record recovery reads (in characters of its JSON, as written). */
export const MAX_RECORD = 256 * 1024;

/**
 * What the APIs let a sandbox hold, in characters of each part's compact JSON (escapes counted),
 * so that its record always fits in MAX_RECORD with room for the rest (its egress rules, paths,
 * E2B's settings): both forkd's and E2B's bodies are refused (400, naming the field) past these.
 */
export const RECORD_BUDGET = {
  /** The sandbox's metadata labels. */
  metadata: 32 << 10,
  /** Its sandbox-wide environment. */
  env: 64 << 10,
  /** E2B's network.allowOut, and denyOut, each. */
  networkList: 16 << 10,
} as const;

/** Characters of `v`'s compact JSON: what RECORD_BUDGET bounds. */
export const jsonChars = (v: unknown): number => JSON.stringify(v).length;
