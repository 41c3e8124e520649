/**
 * The CAs a certificate of a cluster's node must chain to, for what reaches nodes over https (a
 * gateway's relays and calls, a node's pulls from its peers): the CAs Node trusts by default,
 * plus the certificates of an operator's PEM file (FORKD_NODE_CA_FILE: a cluster's private CA),
 * read and checked once at start. A file that cannot be read or holds no certificate that parses
 * is refused with its reason: the process does not start.
 */
import { X509Certificate } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createSecureContext, rootCertificates } from "node:tls";
import type { SecureContext } from "node:tls";
import { ForkdError, errorMessage } from "./errors.js";

const PEM_CERT = /-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----/g;

/** The trust of `pem` (the text of setting `name`'s file `path`) added to Node's default CAs. */
export function nodeTrust(name: string, path: string, pem: string): SecureContext {
  const bad = (why: string) => new ForkdError("invalid_argument", `${name} ${path}: ${why}`, { field: name });
  const certs = pem.match(PEM_CERT) ?? [];
  if (certs.length === 0) throw bad("holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
  certs.forEach((c, i) => {
    try {
      new X509Certificate(c);
    } catch (e) {
      throw bad(`its certificate ${i + 1} does not parse: ${errorMessage(e)}`);
    }
  });
  try {
    return createSecureContext({ ca: [...rootCertificates, ...certs] });
  } catch (e) {
    throw bad(errorMessage(e));
  }
}

/** FORKD_NODE_CA_FILE (setting `name` of `env`): its trust, or null when unset (Node's CAs). */
export async function readNodeTrust(
  env: NodeJS.ProcessEnv,
  name = "FORKD_NODE_CA_FILE",
): Promise<SecureContext | null> {
  const path = env[name];
  if (!path) return null;
  let pem: string;
  try {
    pem = await readFile(path, "utf8");
  } catch (e) {
    throw new ForkdError("invalid_argument", `cannot read ${name} ${path}: ${errorMessage(e)}`, {
      field: name,
    });
  }
  return nodeTrust(name, path, pem);
}
