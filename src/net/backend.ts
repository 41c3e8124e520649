/**
 * The host side of the guest's network device (what an attachment, ./attachments/, gives a VMM;
 * src/vmm/config.ts puts it on the QEMU command line). The device (and its MAC) is the same in a parent
 * and all its children; the backend is each VMM's own:
 *   - none: a hub port with nothing else on the hub. Frames the guest sends go nowhere and no
 *     host code parses them (unlike a restricted slirp); QEMU opens no socket or device for it.
 *   - user: QEMU's user-mode stack (slirp) in the VMM process: restrict=on allows nothing out;
 *     `forwards` are hostfwd listeners.
 *   - tap: the tap device `ifname` of the namespace the VMM was started in (`netns`), which the
 *     jailer opens as root and hands over on TAP_FD (the VMM itself is unprivileged).
 */
export type NetBackend =
  | { kind: "none" }
  | {
      kind: "user";
      restrict: boolean;
      forwards: Array<{ hostAddr: string; hostPort: number; guestPort: number }>;
    }
  | { kind: "tap"; ifname: string };
