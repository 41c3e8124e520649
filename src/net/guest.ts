/**
 * The guest's side of the network, the same in every VM: a parent is booted with it (the agent
 * configures eth0 from `forkd.net=` on the kernel command line, guest/agent/src/net.c) and every
 * child inherits it with the parent's memory, so all children have the same address. What a
 * child can reach is decided on the host, by the backend its VMM gets (./plan.ts).
 *
 * The numbers are QEMU's user-mode defaults, so a guest sees one network whichever backend it
 * has: in a netns slot the tap device plays the gateway (same address and MAC as slirp's).
 */

export interface GuestNet {
  /** The guest's address and prefix length. */
  addr: string;
  prefix: number;
  gateway: string;
  /** The resolver the guest is told to use (answered, or refused, by the host's policy). */
  dns: string;
  /** The gateway's MAC: slirp's for 10.0.2.2; netns slots give their tap the same. */
  gatewayMac: string;
  /** The guest NIC's MAC (a device property: must match between parent and children). */
  mac: string;
}

/**
 * A guest NIC as a snapshot records it (src/snapshot/meta.ts `nic`): the guest network its
 * children inherit, and the link state its device state saved.
 */
export interface RecordedNic extends GuestNet {
  linkUp: boolean;
}

export const GUEST_NET: GuestNet = {
  addr: "10.0.2.15",
  prefix: 24,
  gateway: "10.0.2.2",
  dns: "10.0.2.3",
  gatewayMac: "52:55:0a:00:02:02",
  mac: "52:54:00:12:34:56",
};

/** The network the guest is on (10.0.2.0/24). */
export const guestSubnet = (g: GuestNet): string => {
  const n = ipToInt(g.addr) & prefixMask(g.prefix);
  return `${intToIp(n)}/${g.prefix}`;
};

/** The kernel command line option the agent reads. */
export const guestNetArg = (g: GuestNet): string =>
  `forkd.net=${g.addr}/${g.prefix},${g.gateway},${g.dns},${g.gatewayMac}`;

export const sameGuestNet = (a: GuestNet, b: GuestNet): boolean =>
  a.addr === b.addr &&
  a.prefix === b.prefix &&
  a.gateway === b.gateway &&
  a.dns === b.dns &&
  a.gatewayMac === b.gatewayMac &&
  a.mac === b.mac;

export function ipToInt(ip: string): number {
  const parts = ip.split(".").map(Number);
  return (
    ((parts[0] ?? 0) * 2 ** 24 + (parts[1] ?? 0) * 2 ** 16 + (parts[2] ?? 0) * 2 ** 8 + (parts[3] ?? 0)) >>> 0
  );
}

export const intToIp = (n: number): string =>
  [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");

export const prefixMask = (prefix: number): number => (prefix === 0 ? 0 : (~0 << (32 - prefix)) >>> 0);
