/**
 * What net offers: per-child networking (slots, nftables rules, egress policy, exposed ports, host
 * access). Other folders import this folder through this file alone (test/unit/layering.test.ts).
 */
export type { Attachment } from "./attachments/attachment.js";
export type { NetBackend } from "./backend.js";
export { detectNetwork } from "./capability.js";
export { GUEST_NET, guestNetArg, guestSubnet } from "./guest.js";
export type { GuestNet } from "./guest.js";
export { MAX_ALLOW_RULES, MAX_EXPOSE, MAX_PORTS_PER_RULE, NO_NETWORK, parseNetwork } from "./policy.js";
export type { Egress, NetMode, NetworkSpec } from "./policy.js";
export { NetworkService, guestNetOf } from "./service.js";
export type { NetworkRecord } from "./service.js";
