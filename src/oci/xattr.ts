/**
 * Extended attributes on the flattened tree. Node has no setxattr, so they are set with the
 * `attr` package's setfattr (-h: on a symlink itself, never its target), one call per
 * attribute, bounded in time. Only namespaces that mean something in a guest's root are
 * applied: user.*, trusted.*, security.capability (file capabilities) and POSIX ACLs; others
 * (security.selinux, security.ima, …) are skipped and counted.
 */
import { run } from "../util/index.js";

export const SETFATTR = "setfattr";
/** An attribute value is at most this large (the kernel's bound is 64 KiB). */
export const MAX_XATTR_VALUE = 64 << 10;

export function xattrApplies(name: string): boolean {
  return (
    name.startsWith("user.") ||
    name.startsWith("trusted.") ||
    name === "security.capability" ||
    name === "system.posix_acl_access" ||
    name === "system.posix_acl_default"
  );
}

export async function setXattr(path: string, name: string, value: Buffer): Promise<void> {
  await run(SETFATTR, ["-h", "-n", name, "-v", `0x${value.toString("hex")}`, "--", path], {
    timeoutMs: 10_000,
  });
}
