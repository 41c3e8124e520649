/**
 * IP addresses as 16 bytes (an IPv4 address as its IPv4-mapped IPv6 form, so one table covers
 * both families), and why an address is not a public unicast one: loopback, unspecified,
 * link-local (the cloud metadata service's 169.254.169.254 among them), private and unique-local,
 * shared (CGNAT), multicast, reserved and documentation ranges, and the IPv6 forms that carry an
 * IPv4 address (mapped, compatible, NAT64, 6to4) judged by the address they carry.
 */
import { isIPv4, isIPv6 } from "node:net";

/** `a.b.c.d` → its 4 bytes (the caller checked it is IPv4). */
function v4Bytes(text: string): number[] {
  return text.split(".").map((x) => Number(x));
}

/** An IPv6 address's 16 bytes (a zone `%eth0` dropped), or null when it is not one. */
function v6Bytes(text: string): Uint8Array | null {
  const s = text.replace(/%.*$/, "");
  if (!isIPv6(s)) return null;
  let head = s;
  let tail4: number[] = [];
  const lastColon = s.lastIndexOf(":");
  if (s.slice(lastColon + 1).includes(".")) {
    tail4 = v4Bytes(s.slice(lastColon + 1));
    head = s.slice(0, lastColon + 1);
    if (head.endsWith(":") && !head.endsWith("::")) head = head.slice(0, -1);
  }
  const groupsWanted = 8 - tail4.length / 2;
  const halves = head.split("::");
  const parse = (part: string) => (part === "" ? [] : part.split(":").map((g) => parseInt(g, 16)));
  const left = parse(halves[0] ?? "");
  const right = halves.length > 1 ? parse(halves[1] ?? "") : [];
  const fill = halves.length > 1 ? groupsWanted - left.length - right.length : 0;
  const groups = [...left, ...Array<number>(fill).fill(0), ...right];
  if (groups.length !== groupsWanted) return null;
  const out = new Uint8Array(16);
  groups.forEach((g, i) => {
    out[2 * i] = g >> 8;
    out[2 * i + 1] = g & 0xff;
  });
  tail4.forEach((b, i) => (out[12 + i] = b));
  return out;
}

/** The 16 bytes of an IPv4 or IPv6 address (IPv4 as ::ffff:a.b.c.d), or null for anything else. */
export function ipBytes(text: string): Uint8Array | null {
  const s = text.replace(/^\[|\]$/g, "");
  if (isIPv4(s)) return Uint8Array.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ...v4Bytes(s)]);
  return v6Bytes(s);
}

/** A stable key for comparing addresses (the hex of their 16 bytes). */
export const ipKey = (b: Uint8Array): string => Buffer.from(b).toString("hex");

interface Range {
  bytes: Uint8Array;
  bits: number;
  why: string;
}

const range = (cidr: string, why: string): Range => {
  const [addr = "", bits = ""] = cidr.split("/");
  const bytes = ipBytes(addr);
  if (!bytes) throw new Error(`bad range ${cidr}`);
  // An IPv4 prefix counts after the 96 bits of the mapped form.
  return { bytes, bits: Number(bits) + (isIPv4(addr) ? 96 : 0), why };
};

function inRange(b: Uint8Array, r: Range): boolean {
  for (let bit = 0; bit < r.bits; bit += 8) {
    const left = r.bits - bit;
    const mask = left >= 8 ? 0xff : (0xff << (8 - left)) & 0xff;
    if (((b[bit / 8] ?? 0) & mask) !== ((r.bytes[bit / 8] ?? 0) & mask)) return false;
  }
  return true;
}

/** Ranges that are not public unicast (RFC 6890's special-purpose registries, in short). */
const NOT_PUBLIC: Range[] = [
  range("0.0.0.0/8", "unspecified"),
  range("10.0.0.0/8", "private"),
  range("100.64.0.0/10", "shared (CGNAT)"),
  range("127.0.0.0/8", "loopback"),
  range("169.254.0.0/16", "link-local"),
  range("172.16.0.0/12", "private"),
  range("192.0.0.0/24", "reserved"),
  range("192.0.2.0/24", "documentation"),
  range("192.88.99.0/24", "reserved"),
  range("192.168.0.0/16", "private"),
  range("198.18.0.0/15", "reserved"),
  range("198.51.100.0/24", "documentation"),
  range("203.0.113.0/24", "documentation"),
  range("224.0.0.0/4", "multicast"),
  range("240.0.0.0/4", "reserved"),
  range("::/128", "unspecified"),
  range("::1/128", "loopback"),
  range("::/96", "IPv4-compatible"),
  range("64:ff9b:1::/48", "reserved"),
  range("100::/64", "reserved"),
  range("2001::/23", "reserved"),
  range("2001:db8::/32", "documentation"),
  range("3fff::/20", "documentation"),
  range("fc00::/7", "unique-local"),
  range("fe80::/10", "link-local"),
  range("fec0::/10", "site-local"),
  range("ff00::/8", "multicast"),
];

/** IPv6 forms that carry an IPv4 address elsewhere than ::ffff:0:0/96: judged by the address carried. */
const NAT64 = range("64:ff9b::/96", "");
const SIX_TO_FOUR = range("2002::/16", "");

const asMapped = (v4: Uint8Array): Uint8Array =>
  Uint8Array.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ...v4]);

/**
 * Why `b` is not a public address ("loopback", "private", "this host's own", ...), or null when
 * it is one. `own` holds the keys (ipKey) of the host's own addresses.
 */
export function notPublic(b: Uint8Array, own: ReadonlySet<string> = new Set()): string | null {
  if (own.has(ipKey(b))) return "this host's own";
  if (inRange(b, NAT64)) return notPublic(asMapped(b.subarray(12, 16)), own);
  if (inRange(b, SIX_TO_FOUR)) return notPublic(asMapped(b.subarray(2, 6)), own);
  for (const r of NOT_PUBLIC) if (inRange(b, r)) return r.why;
  return null;
}
