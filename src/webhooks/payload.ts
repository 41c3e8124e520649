/**
 * What a webhook is sent: one lifecycle event as JSON in E2B's shape (its webhook payload,
 * version "v2": type `sandbox.lifecycle.<event>`, sandboxId, sandboxTeamId, sandboxTemplateId,
 * timestamp, eventData) plus its events API's eventCategory/eventLabel, and forkd's own fields
 * (exit reason, snapshot, node) in eventData. Snapshot keys are named as the webhook's tenant
 * names them (its own without the namespace), as the API shows them to it.
 */
import { nameFor } from "../snapshot/index.js";
import type { LifecycleEvent, LifecycleType } from "./lifecycle.js";

/** E2B's events API's label of each event (forkd's own where E2B has none). */
const LABELS: Record<LifecycleType, string> = {
  created: "create",
  paused: "pause",
  resumed: "resume",
  killed: "kill",
  exited: "exit",
  branched: "branch",
};

export const eventType = (t: LifecycleType): string => `sandbox.lifecycle.${t}`;

export function payloadOf(
  e: LifecycleEvent,
  o: { id: string; webhookId: string; tenant: string | null; node: string | null },
): Record<string, unknown> {
  const eventData: Record<string, unknown> = { sandbox_metadata: e.metadata };
  if (e.exitReason !== undefined) eventData.exit_reason = e.exitReason;
  if (e.snapshot !== undefined) eventData.snapshot = nameFor(o.tenant, e.snapshot);
  if (o.node !== null) eventData.node = o.node;
  return {
    version: "v2",
    id: o.id,
    type: eventType(e.type),
    eventCategory: "lifecycle",
    eventLabel: LABELS[e.type],
    webhookId: o.webhookId,
    sandboxId: e.sandboxId,
    sandboxTeamId: e.owner,
    sandboxTemplateId: e.tag === null ? null : nameFor(o.tenant, e.tag),
    timestamp: new Date(e.at).toISOString(),
    eventData,
  };
}
