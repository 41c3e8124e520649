/** The guest's ERROR reply (errno and message) as a ForkdError with the caller's error code. */
import { ForkdError } from "../util/index.js";
import { intField, strField, Tag } from "./codec.js";
import type { Field } from "./codec.js";
import { errnoCode, errnoName } from "./errno.js";

export function guestError(fields: Field[]): ForkdError {
  const errno = intField(fields, Tag.ERRNO) ?? 0;
  const message = strField(fields, Tag.MESSAGE) ?? "guest error";
  return new ForkdError(errnoCode(errno), message, { errno, errno_name: errnoName(errno) });
}
