/** Identifiers and names that reach the filesystem: validated here, before any path is built. */
import { randomBytes } from "node:crypto";
import { ForkdError } from "./errors.js";

export const TAG_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
/** Tenant names (tokens' `tenant`): lowercase, so never a snapshot tag's capital-letter form. */
export const TENANT_RE = /^[a-z0-9][a-z0-9_.-]{0,63}$/;
/**
 * A snapshot's key in the store: a tag of the admins' namespace (`NAME`) or of a tenant's
 * (`TENANT/NAME`): src/snapshot/namespace.ts.
 */
export const KEY_RE = /^(?:[a-z0-9][a-z0-9_.-]{0,63}\/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
/** Sandbox ids: "sb-" + 16 lowercase base32 characters (80 random bits). */
export const SANDBOX_ID_RE = /^sb-[a-z2-7]{16}$/;
export const TEMPLATE_RE = /^[a-z][a-z0-9-]{0,31}$/;

const B32 = "abcdefghijklmnopqrstuvwxyz234567";

/** `prefix` + 16 lowercase base32 characters (80 random bits). */
export function newRandomId(prefix: string): string {
  const bytes = randomBytes(16);
  let out = prefix;
  for (let i = 0; i < 16; i++) out += B32[bytes[i]! & 31];
  return out;
}

export const newSandboxId = (): string => newRandomId("sb-");

export function isValidTag(tag: unknown): tag is string {
  return typeof tag === "string" && TAG_RE.test(tag) && tag !== "." && tag !== "..";
}

export function assertTag(tag: unknown): string {
  if (!isValidTag(tag)) {
    throw new ForkdError(
      "invalid_argument",
      `invalid tag ${JSON.stringify(tag)}: must match ${TAG_RE.source}`,
      {
        field: "tag",
      },
    );
  }
  return tag;
}

/** A store key (see KEY_RE; neither part can be "." or "..": each starts with a letter or digit). */
export function isValidKey(key: unknown): key is string {
  return typeof key === "string" && KEY_RE.test(key);
}

export function assertKey(key: unknown): string {
  if (!isValidKey(key)) {
    throw new ForkdError(
      "invalid_argument",
      `invalid tag ${JSON.stringify(key)}: must match ${TAG_RE.source}, or TENANT/TAG`,
      { field: "tag" },
    );
  }
  return key;
}

export function assertSandboxId(id: unknown): string {
  if (typeof id !== "string" || !SANDBOX_ID_RE.test(id)) {
    throw new ForkdError("invalid_argument", `invalid sandbox id ${JSON.stringify(id)}`, { field: "id" });
  }
  return id;
}

export function assertTemplate(name: unknown): string {
  if (typeof name !== "string" || !TEMPLATE_RE.test(name)) {
    throw new ForkdError("invalid_argument", `invalid template ${JSON.stringify(name)}`, {
      field: "template",
    });
  }
  return name;
}
