/**
 * A directory watched for envd (WatchDir's stream and the polling watchers): the guest agent's
 * inotify watch, its events as E2B's FilesystemEvent (the path relative to the watched
 * directory, the event type, the entry's info when asked and it still exists).
 */
import { posix } from "node:path";
import { create } from "@bufbuild/protobuf";
import type { AgentClient, Consumed } from "../../agent/index.js";
import type { WatchEvent, WatchHandle } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";
import { statEntry } from "./entry-info.js";
import { EventType, FileType, FilesystemEventSchema } from "./gen/filesystem/filesystem_pb.js";
import type { FilesystemEvent } from "./gen/filesystem/filesystem_pb.js";

const TYPES: Record<Exclude<WatchEvent["type"], "overflow">, EventType> = {
  create: EventType.CREATE,
  write: EventType.WRITE,
  remove: EventType.REMOVE,
  rename: EventType.RENAME,
  chmod: EventType.CHMOD,
};

export interface WatchSpec {
  /** The watched directory, absolute. */
  dir: string;
  recursive: boolean;
  includeEntry: boolean;
  /** The request's user: entries are stat-ed as it. */
  user: string;
  /**
   * Whom the agent watches as (its permissions, also for directories added later): the user,
   * or undefined for root, and for an agent older than file users (after the stat as the user).
   */
  agentUser: string | undefined;
}

/**
 * Starts watching `spec.dir` (a directory the user can stat); `onEvent` paces the events like
 * exec output. Resolves once the guest watches.
 */
export async function startWatch(
  agent: AgentClient,
  spec: WatchSpec,
  onEvent: (e: FilesystemEvent) => Consumed,
): Promise<WatchHandle> {
  const top = await statEntry(agent, spec.user, spec.dir);
  if (top.type !== FileType.DIRECTORY)
    throw new ForkdError("invalid_argument", `path ${spec.dir} is not a directory`);
  const h = agent.watch(spec.dir, { recursive: spec.recursive, user: spec.agentUser }, (ev) => {
    if (ev.type === "overflow") return undefined;
    const name = posix.relative(spec.dir, ev.path) || posix.basename(ev.path);
    const base = { name, type: TYPES[ev.type] };
    if (!spec.includeEntry || ev.type === "remove" || ev.type === "rename")
      return onEvent(create(FilesystemEventSchema, base));
    return statEntry(agent, spec.user, ev.path).then(
      (entry) => onEvent(create(FilesystemEventSchema, { ...base, entry })),
      () => onEvent(create(FilesystemEventSchema, base)),
    );
  });
  try {
    await h.ready;
  } catch (e) {
    h.stop();
    throw e;
  }
  return h;
}
