/**
 * nftables rulesets, as text for `nft -f -`, generated from typed inputs only (addresses and
 * ports already parsed: nothing here is user text). Each function returns one transaction, which
 * nft applies atomically: a table is replaced with "add; delete; define", so there is never a
 * moment without rules, also when a restarted daemon rewrites the rules of running children.
 *
 * Host table `inet forkd_<id>` (the policy; in the host namespace, out of the VMM's reach):
 *   input    from any slot veth: replies, else to_host
 *   forward  into a slot: replies only (so slots never reach each other, and nothing outside
 *            opens a connection to one); out of a slot: replies; else, redirected by the host
 *            (DNAT: a port the host publishes) to_host; else its egress chain sI; else rejected
 *   to_host  a slot's new connection to the host itself (any address of the host: the kernel
 *            routes it to input, whatever the interface and whenever the address was added) or
 *            to what the host redirected: never the daemon's TCP ports, else the slot's host
 *            chain hI, else rejected. The tenant's egress chain sI is never consulted here:
 *            hI holds DNS to the resolver and, only where the operator opened host
 *            destinations (FORKD_NET_HOST_ALLOW, chain host_open), the slot's policy leading
 *            there; matched on the connection's original destination (before any DNAT)
 *   postrouting  slot block → anywhere else: masquerade
 * IPv6 from a slot is dropped on both paths (the guest has none; slots have it disabled).
 * Slot namespace table `ip forkd` (plumbing; the guest sits behind the tap):
 *   guest → veth0 masqueraded to the slot's address; DNS to 10.0.2.3 DNATed to the host's
 *   resolver (passed or refused by the host's policy); exposed ports DNATed from the slot's
 *   address to the guest.
 */
import type { GuestNet } from "./guest.js";
import { guestSubnet } from "./guest.js";
import type { AllowRule, Egress } from "./policy.js";
import type { NetInstance, Slot } from "./slots.js";
import { blockText, hostIfPrefix, slotOf, tableName } from "./slots.js";

/** Destinations `allow` never covers: this network, loopback, link-local (cloud metadata), multicast and reserved. */
export const NEVER = ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"];

const REJECT = "reject with icmpx type admin-prohibited";

const portSet = (ports: Array<[number, number]>): string =>
  `{ ${ports.map(([lo, hi]) => (lo === hi ? String(lo) : `${lo}-${hi}`)).join(", ")} }`;

/** What every slot's rules depend on besides its own policy. */
export interface RuleContext {
  /** The host's resolver, for DNS (null: no DNS for slots). */
  resolver: string | null;
  /** Whether the operator opened any host destination (chain host_open is not empty). */
  hostOpen: boolean;
}

export interface HostTableOptions {
  /** TCP ports of the host no slot may reach whatever its policy (the daemon's API). */
  protectedPorts: number[];
  /** The host's resolver, for DNS (null: no DNS for slots). */
  resolver: string | null;
  /** Host destinations the operator opened to sandboxes (FORKD_NET_HOST_ALLOW; ./host-access.ts). */
  hostOpen: AllowRule[];
  /** Policies of slots in use (their chains are filled; every other slot's chain is empty). */
  policies: Map<number, Egress>;
}

/** Matches a connection's original destination (as the slot asked, before any DNAT). */
const toOriginal = (r: AllowRule): string =>
  r.ports
    ? `ct original ip daddr ${r.cidr} meta l4proto { tcp, udp } ct original proto-dst ${portSet(r.ports)}`
    : `ct original ip daddr ${r.cidr}`;

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
    `    jump to_host`,
    `    ${REJECT}`,
    `  }`,
    `  chain to_host {`,
    ...(o.protectedPorts.length > 0
      ? [
          `    tcp dport ${portSet(o.protectedPorts.map((p) => [p, p]))} reject with tcp reset`,
          `    meta l4proto tcp ct original proto-dst ${portSet(o.protectedPorts.map((p) => [p, p]))} reject with tcp reset`,
        ]
      : []),
    `    iifname vmap ${vmap("h")}`,
    `  }`,
    `  chain host_open {`,
    ...o.hostOpen.map((r) => `    ${toOriginal(r)} accept`),
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
    // Redirected by the host (a published port on one of its addresses): the host's, not the
    // egress policy's, whatever address it now leads to.
    `    ct status dnat jump to_host`,
    `    ct status dnat ${REJECT}`,
    `    iifname vmap ${vmap("s")}`,
    `    ${REJECT}`,
    `  }`,
    `  chain postrouting {`,
    `    type nat hook postrouting priority srcnat; policy accept;`,
    `    ip saddr ${blockText(inst)} oifname != ${ifs} masquerade`,
    `  }`,
  ];
  const ctx: RuleContext = { resolver: o.resolver, hostOpen: o.hostOpen.length > 0 };
  for (const s of slots) {
    const p = o.policies.get(s.index);
    const { egress, host } = p ? slotRules(p, ctx) : { egress: [], host: [] };
    lines.push(`  chain s${s.index} {`, ...egress.map((r) => `    ${r}`), `  }`);
    lines.push(`  chain h${s.index} {`, ...host.map((r) => `    ${r}`), `  }`);
  }
  lines.push(`}`);
  return lines.join("\n") + "\n";
}

/**
 * One slot's policy as rules: `egress` for its chain sI (forwarded), `host` for hI (to the host
 * itself, or redirected by it): DNS to the resolver, and only with host destinations opened by
 * the operator, the policy's own reach into them (egress `allow`: all of them; `list`: each
 * entry, jumping to host_open, which accepts what the operator opened).
 */
export function slotRules(e: Egress, ctx: RuleContext): { egress: string[]; host: string[] } {
  const egress: string[] = [];
  const host: string[] = [];
  if (e.dns && ctx.resolver) {
    egress.push(`ip daddr ${ctx.resolver} meta l4proto { tcp, udp } th dport 53 accept`);
    // Also to the host's chain: the resolver may be one of the host's own addresses.
    host.push(toOriginal({ cidr: `${ctx.resolver}/32`, ports: [[53, 53]] }) + " accept");
  }
  if (e.mode === "allow") {
    if (!e.dns) egress.push(`meta l4proto { tcp, udp } th dport 53 ${REJECT}`);
    egress.push(`ip daddr @never ${REJECT}`, `accept`);
    if (ctx.hostOpen) host.push(`jump host_open`);
  } else if (e.mode === "list") {
    for (const r of e.allow) {
      egress.push(
        r.ports
          ? `ip daddr ${r.cidr} meta l4proto { tcp, udp } th dport ${portSet(r.ports)} accept`
          : `ip daddr ${r.cidr} accept`,
      );
      if (ctx.hostOpen) host.push(`${toOriginal(r)} jump host_open`);
    }
  }
  return { egress, host };
}

/** Replaces the rules of slot `index` (one transaction; nothing is allowed while it is free). */
export function slotPolicy(inst: NetInstance, index: number, e: Egress | null, ctx: RuleContext): string {
  const t = tableName(inst);
  const { egress, host } = e ? slotRules(e, ctx) : { egress: [], host: [] };
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
