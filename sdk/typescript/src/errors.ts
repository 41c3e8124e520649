/**
 * Typed errors, mapped from the daemon's error envelope ({"error": {"code", "message",
 * "details"}}). Catch `ForkdError` for all of them, or a subclass for one kind.
 */

import type { ErrorCodeWire } from "./types.js";

export class ForkdError extends Error {
  /** The daemon's stable error code (e.g. "not_found"), or a local one ("connection"). */
  readonly code: string;
  /** HTTP status, or 0 when the daemon was not reached. */
  readonly status: number;
  readonly details: Record<string, unknown>;

  constructor(
    message: string,
    opts: { code?: string; status?: number; details?: Record<string, unknown>; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = opts.code ?? "internal";
    this.status = opts.status ?? 0;
    this.details = opts.details ?? {};
  }
}

/** E2B's name for the base class. */
export { ForkdError as SandboxError };

export class InvalidArgumentError extends ForkdError {}
export class NotFoundError extends ForkdError {}
export class ConflictError extends ForkdError {}
export class TimeoutError extends ForkdError {}
/** No valid token, or a tenant's token on an admin-only operation. */
export class AuthenticationError extends ForkdError {}
/** Too many sandboxes, or a rate limit. */
export class RateLimitError extends ForkdError {}
/** The daemon cannot do it now (e.g. a missing host prerequisite). */
export class UnavailableError extends ForkdError {}
/** The guest misbehaved or its agent failed. */
export class GuestError extends ForkdError {}
/** The daemon could not be reached. */
export class ConnectionError extends ForkdError {}

/** Codes not listed (vmm_error, image_error, snapshot_corrupt, internal) are the base class. */
const BY_CODE: Partial<
  Record<ErrorCodeWire, new (m: string, o: ConstructorParameters<typeof ForkdError>[1]) => ForkdError>
> = {
  invalid_argument: InvalidArgumentError,
  not_found: NotFoundError,
  conflict: ConflictError,
  timeout: TimeoutError,
  unauthenticated: AuthenticationError,
  forbidden: AuthenticationError,
  payload_too_large: InvalidArgumentError,
  resource_exhausted: RateLimitError,
  rate_limited: RateLimitError,
  unavailable: UnavailableError,
  guest_error: GuestError,
  agent_protocol: GuestError,
};

/** The error for a daemon error envelope. */
export function errorFromEnvelope(
  status: number,
  code: string,
  message: string,
  details: Record<string, unknown> = {},
): ForkdError {
  const Cls = BY_CODE[code as ErrorCodeWire] ?? ForkdError;
  return new Cls(message, { code, status, details });
}

/** Thrown by `commands.run()` (and a background command's `wait()`) when the exit code is not 0. */
export class CommandExitError extends ForkdError {
  constructor(readonly result: CommandResult) {
    super(
      `command exited with ${result.signal !== null ? `signal ${result.signal}` : `code ${result.exitCode}`}` +
        (result.stderr ? `: ${result.stderr.slice(0, 500)}` : ""),
      { code: "command_exit" },
    );
  }
  get exitCode(): number {
    return this.result.exitCode;
  }
  get stdout(): string {
    return this.result.stdout;
  }
  get stderr(): string {
    return this.result.stderr;
  }
  get error(): string | undefined {
    return this.result.error;
  }
}

/** What a finished command left. `exitCode` is -1 when a signal ended it. */
export interface CommandResult {
  exitCode: number;
  signal: number | null;
  timedOut: boolean;
  stdout: string;
  stderr: string;
  /** Why it did not exit normally (signal or timeout), if it did not. */
  error?: string;
}

/**
 * A command ran past its `timeoutMs` and was killed: E2B's SDKs throw their TimeoutError for it.
 * A TimeoutError here too, with the result (the output so far) as CommandExitError has it.
 */
export class CommandTimeoutError extends TimeoutError {
  constructor(readonly result: CommandResult) {
    super(
      `command timed out (killed after its timeout)${result.stderr ? `: ${result.stderr.slice(0, 500)}` : ""}`,
      {
        code: "timeout",
      },
    );
  }
  get exitCode(): number {
    return this.result.exitCode;
  }
  get stdout(): string {
    return this.result.stdout;
  }
  get stderr(): string {
    return this.result.stderr;
  }
}
