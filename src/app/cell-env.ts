/** The bounds of a code cell's own env vars, one rule for every door (forkd's eval, E2B's /execute `env_vars`). */
import { z } from "zod";

export const CellEnv = z
  .record(
    z
      .string()
      .min(1)
      .max(1024)
      .regex(/^[^=\0]+$/, "an env var name has no '=' or NUL"),
    z
      .string()
      .max(128 * 1024)
      .regex(/^[^\0]*$/, "an env var value has no NUL"),
  )
  .refine((o) => Object.keys(o).length <= 1000, "at most 1000 env vars");
