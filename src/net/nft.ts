/**
 * nftables rulesets, as text for `nft -f -`, generated from typed inputs only (addresses and
 * ports already parsed: nothing here is user text). Each function returns one transaction, which
 * nft applies atomically: a table is replaced with "add; delete; define", so there is never a
 * moment without rules, also when a restarted daemon rewrites the rules of running children.
 *
 * Host table `inet forkd_<id>` (the policy; in the host namespace, out of the VMM's reach):
 *   input    from any slot veth: replies, else the slot's host chain hI (allow-listed /32s),
 *            never the daemon's TCP ports; everything else rejected
 *   forward  into a slot: replies only (so slots never reach each other, and nothing outside
 *            opens a connection to one); out of a slot: replies, else its egress chain sI,
 *            else rejected
 *   postrouting  slot block → anywhere else: masquerade
 * Slot namespace table `ip forkd` (plumbing; the guest sits behind the tap):
 *   guest → veth0 masqueraded to the slot's address; DNS to 10.0.2.3 DNATed to the host's
 *   resolver (passed or refused by the host's policy); exposed ports DNATed from the slot's
 *   address to the guest.
 */
import type { GuestNet } from "./guest.js";
import { guestSubnet } from "./guest.js";
import type { Egress } from "./policy.js";
import type { NetInstance, Slot } from "./slots.js";
import { blockText, hostIfPrefix, slotOf, tableName } from "./slots.js";

/** Destinations `allow` never covers: this network, loopback, link-local (cloud metadata), multicast and reserved. */
export const NEVER = ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"];

const REJECT = "reject with icmpx type admin-prohibited";

const portSet = (ports: Array<[number, number]>): string =>
  `{ ${ports.map(([lo, hi]) => (lo === hi ? String(lo) : `${lo}-${hi}`)).join(", ")} }`;

export interface HostTableOptions {
  /** TCP ports of the host no slot may reach whatever its policy (the daemon's API). */
  protectedPorts: number[];
  /** The host's resolver, for DNS (null: no DNS for slots). */
  resolver: string | null;
  /** Policies of slots in use (their chains are filled; every other slot's chain is empty). */
  policies: Map<number, Egress>;
}

/** The whole host table: every slot's chains exist from the start (empty = nothing allowed). */
export function hostTable(inst: NetInstance, o: HostTableOptions): string {
  const t = tableName(inst);
  const ifs = `"${hostIfPrefix(inst)}*"`;
  const slots = Array.from({ length: inst.maxSlots }, (_, i) => slotOf(inst, i));
  const vmap = (prefix: string) =>
    `{ ${slots.map((s) => `"${s.hostIf}" : jump ${prefix}${s.index}`).join(", ")} }`;
  const lines = [
    `add table inet ${t}`,
    `delete table inet ${t}`,
    `table inet ${t} {`,
    `  set never { type ipv4_addr; flags interval; elements = { ${NEVER.join(", ")} } }`,
    `  chain input {`,
    `    type filter hook input priority filter; policy accept;`,
    `    iifname ${ifs} jump slot_to_host`,
    `  }`,
    `  chain slot_to_host {`,
    `    ct state established,related accept`,
    `    meta nfproto != ipv4 drop`,
    ...(o.protectedPorts.length > 0
      ? [`    tcp dport ${portSet(o.protectedPorts.map((p) => [p, p]))} reject with tcp reset`]
      : []),
    `    iifname vmap ${vmap("h")}`,
    `    ${REJECT}`,
    `  }`,
    `  chain forward {`,
    `    type filter hook forward priority filter; policy accept;`,
    `    oifname ${ifs} ct state established,related accept`,
    `    oifname ${ifs} drop`,
    `    iifname ${ifs} jump slot_out`,
    `  }`,
    `  chain slot_out {`,
    `    ct state established,related accept`,
    `    meta nfproto != ipv4 drop`,
    `    iifname vmap ${vmap("s")}`,
    `    ${REJECT}`,
    `  }`,
    `  chain postrouting {`,
    `    type nat hook postrouting priority srcnat; policy accept;`,
    `    ip saddr ${blockText(inst)} oifname != ${ifs} masquerade`,
    `  }`,
  ];
  for (const s of slots) {
    const p = o.policies.get(s.index);
    const { egress, host } = p ? slotRules(p, o.resolver) : { egress: [], host: [] };
    lines.push(`  chain s${s.index} {`, ...egress.map((r) => `    ${r}`), `  }`);
    lines.push(`  chain h${s.index} {`, ...host.map((r) => `    ${r}`), `  }`);
  }
  lines.push(`}`);
  return lines.join("\n") + "\n";
}

/** One slot's policy as rules: `egress` for its chain sI (forwarded), `host` for hI (to the host). */
export function slotRules(e: Egress, resolver: string | null): { egress: string[]; host: string[] } {
  const egress: string[] = [];
  const host: string[] = [];
  if (e.dns && resolver) {
    // Also to the host's chain: the resolver may be one of the host's own addresses.
    const dns = `ip daddr ${resolver} meta l4proto { tcp, udp } th dport 53 accept`;
    egress.push(dns);
    host.push(dns);
  }
  if (e.mode === "allow") {
    if (!e.dns) egress.push(`meta l4proto { tcp, udp } th dport 53 ${REJECT}`);
    egress.push(`ip daddr @never ${REJECT}`, `accept`);
  } else if (e.mode === "list") {
    for (const r of e.allow) {
      const rule = r.ports
        ? `ip daddr ${r.cidr} meta l4proto { tcp, udp } th dport ${portSet(r.ports)} accept`
        : `ip daddr ${r.cidr} accept`;
      egress.push(rule);
      // The host's own services only by an explicit single address: a wide entry such as
      // 0.0.0.0/0 port 443 means "the internet's port 443", not the host's.
      if (r.cidr.endsWith("/32")) host.push(rule);
    }
  }
  return { egress, host };
}

/** Replaces the rules of slot `index` (one transaction; nothing is allowed while it is free). */
export function slotPolicy(
  inst: NetInstance,
  index: number,
  e: Egress | null,
  resolver: string | null,
): string {
  const t = tableName(inst);
  const { egress, host } = e ? slotRules(e, resolver) : { egress: [], host: [] };
  return (
    [
      `flush chain inet ${t} s${index}`,
      `flush chain inet ${t} h${index}`,
      ...egress.map((r) => `add rule inet ${t} s${index} ${r}`),
      ...host.map((r) => `add rule inet ${t} h${index} ${r}`),
    ].join("\n") + "\n"
  );
}

export interface NsTableOptions {
  /** What the VMM in the slot uses: a tap (netns, and free slots) or its own sockets (user). */
  backend: "tap" | "user";
  /**
   * DNS target for the guest's 10.0.2.3 (tap only): the host's resolver (whether the query then
   * passes is the host's policy), or null (no resolver: refused in the slot).
   */
  dnsTo: string | null;
  /** Guest TCP ports the host may connect to, at the slot's address. */
  expose: number[];
}

/** The slot namespace's own table (replaced as a whole whenever its use changes). */
export function nsTable(g: GuestNet, slot: Slot, o: NsTableOptions): string {
  const { tapIf: tap, nsIf: up } = slot;
  const exposed = o.expose.length > 0 ? portSet(o.expose.map((p) => [p, p])) : null;
  const lines = [
    `add table ip forkd`,
    `delete table ip forkd`,
    `table ip forkd {`,
    `  chain prerouting {`,
    `    type nat hook prerouting priority dstnat; policy accept;`,
  ];
  if (o.backend === "tap" && o.dnsTo) {
    lines.push(
      `    iifname "${tap}" ip daddr ${g.dns} meta l4proto { tcp, udp } th dport 53 dnat to ${o.dnsTo}`,
    );
  }
  if (o.backend === "tap" && exposed) {
    lines.push(`    iifname "${up}" ip daddr ${slot.nsAddr} tcp dport ${exposed} dnat to ${g.addr}`);
  }
  lines.push(
    `  }`,
    `  chain postrouting {`,
    `    type nat hook postrouting priority srcnat; policy accept;`,
    `    oifname "${up}" ip saddr ${guestSubnet(g)} masquerade`,
    `  }`,
    `  chain input {`,
    `    type filter hook input priority filter; policy drop;`,
    `    iifname "lo" accept`,
    `    ct state established,related accept`,
  );
  if (o.backend === "user" && exposed)
    lines.push(`    iifname "${up}" ip daddr ${slot.nsAddr} tcp dport ${exposed} accept`);
  lines.push(
    // The guest asking the gateway itself (or 10.0.2.3 without DNS): refused at once, not a timeout.
    `    iifname "${tap}" reject with icmp type port-unreachable`,
    `  }`,
    `  chain forward {`,
    `    type filter hook forward priority filter; policy drop;`,
  );
  if (o.backend === "tap") {
    lines.push(
      `    iifname "${tap}" oifname "${up}" ip saddr ${g.addr} accept`,
      `    iifname "${up}" oifname "${tap}" ct state established,related accept`,
      `    iifname "${up}" oifname "${tap}" ct status dnat accept`,
    );
  }
  lines.push(`    iifname "${tap}" reject with icmp type admin-prohibited`, `  }`, `}`);
  return lines.join("\n") + "\n";
}
