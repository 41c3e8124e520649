/** Bounds on request bodies, in bytes, for every front door (docs/operations.md, "Limits"), and the refusal of one past its bound. */
import { ForkdError } from "../util/index.js";

export interface BodyLimits {
  /** Ordinary JSON bodies. */
  json: number;
  /** JSON bodies that carry code or stdin: exec, eval, snapshot creation. */
  code: number;
  /** Raw stdin written to a running command. */
  stdin: number;
  /** A file upload (streamed). */
  upload: number;
  /** A snapshot pack (streamed). */
  pack: number;
}

export const DEFAULT_BODY_LIMITS: BodyLimits = {
  json: 1 << 20,
  code: 20 << 20,
  stdin: 16 << 20,
  upload: 8 * 2 ** 30,
  pack: 64 * 2 ** 30,
};

/** A body larger than `limit` bytes (413). */
export const tooLarge = (limit: number): ForkdError =>
  new ForkdError("payload_too_large", `request body larger than ${limit} bytes`, { limit });
