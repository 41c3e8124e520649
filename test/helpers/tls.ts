/** A throwaway self-signed certificate for 127.0.0.1 (tests of TLS listeners and clients). */
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";

export interface TestCert {
  key: string;
  cert: string;
  /** The certificate's PEM: the CA a client must be given. */
  pem: Buffer;
}

/** Writes key.pem and cert.pem (EC P-256, one day, subjectAltName IP:127.0.0.1) into `dir`. */
export async function selfSignedCert(dir: string): Promise<TestCert> {
  const key = join(dir, "key.pem");
  const cert = join(dir, "cert.pem");
  await promisify(execFile)(
    "openssl",
    [
      ...["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"],
      ...["-days", "1", "-subj", "/CN=forkd-test", "-addext", "subjectAltName=IP:127.0.0.1"],
      ...["-keyout", key, "-out", cert],
    ],
    { timeout: 30_000 },
  );
  return { key, cert, pem: await readFile(cert) };
}
