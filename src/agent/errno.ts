/** Linux errno numbers the guest reports, by name, and the error code each maps to. */
import type { ErrorCode } from "../util/index.js";

const NAMES: Record<number, string> = {
  1: "EPERM",
  2: "ENOENT",
  3: "ESRCH",
  4: "EINTR",
  5: "EIO",
  7: "E2BIG",
  9: "EBADF",
  11: "EAGAIN",
  12: "ENOMEM",
  13: "EACCES",
  16: "EBUSY",
  17: "EEXIST",
  18: "EXDEV",
  20: "ENOTDIR",
  21: "EISDIR",
  22: "EINVAL",
  24: "EMFILE",
  27: "EFBIG",
  28: "ENOSPC",
  30: "EROFS",
  36: "ENAMETOOLONG",
  39: "ENOTEMPTY",
  40: "ELOOP",
  110: "ETIMEDOUT",
  38: "ENOSYS",
  95: "EOPNOTSUPP",
  32: "EPIPE",
};

export const errnoName = (n: number): string => NAMES[n] ?? `E${n}`;

export function errnoCode(n: number): ErrorCode {
  switch (NAMES[n]) {
    case "ENOENT":
      return "not_found";
    case "EEXIST":
    case "ENOTEMPTY":
    case "EBUSY":
      return "conflict";
    case "EINVAL":
    case "ENOTDIR":
    case "EISDIR":
    case "ENAMETOOLONG":
    case "ELOOP":
    case "E2BIG":
    case "EXDEV":
      return "invalid_argument";
    case "ETIMEDOUT":
      return "timeout";
    case "ENOSPC":
    case "EFBIG":
    case "ENOMEM":
    case "EMFILE":
      return "resource_exhausted";
    default:
      return "guest_error";
  }
}
