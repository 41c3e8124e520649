/**
 * No network: the NIC on a hub port to nothing, its link down (the snapshot's own state, so the
 * default fork changes nothing). Holds nothing on the host; no port can be exposed.
 */
import { ForkdError } from "../../util/index.js";
import type { NetBackend } from "../backend.js";
import type { Attachment, NetworkRecord } from "./attachment.js";

const noNetwork = () =>
  new ForkdError(
    "invalid_argument",
    "the sandbox has no network: a port can be exposed on sandboxes created with network mode user or netns",
    { field: "port" },
  );

export class NoneAttachment implements Attachment {
  readonly backend: NetBackend = { kind: "none" };
  readonly linkUp = false;

  async start(): Promise<void> {}

  record(): NetworkRecord {
    return {
      mode: "none",
      egress: { mode: "deny", allow: [], dns: false },
      expose: [],
      guestIp: null,
      slot: null,
      ports: {},
    };
  }

  async release(): Promise<void> {}

  expose(): Promise<void> {
    return Promise.reject(noNetwork());
  }

  async unexpose(): Promise<void> {}

  setEgress(): Promise<void> {
    return Promise.reject(noNetwork());
  }
}
