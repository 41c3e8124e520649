/**
 * Snapshot tags by namespace: the one place a tag a caller writes becomes the store's key, and a
 * key becomes the tag that caller is shown (docs/api.md, "Tags and namespaces").
 *
 * Each tenant has a namespace of its own; the admins have one too. A key is `NAME` (the admins'
 * namespace: shared snapshots, owner null; an admin's private ones, owner `@admin`; and
 * snapshots tenants made before namespaces, kept where they are under their owner: "legacy") or
 * `TENANT/NAME` (tenant TENANT's, owner TENANT). On disk a key is a directory name: `NAME`, or
 * `TENANT~NAME` ("~" is in neither a tag nor a tenant's name).
 *
 * A viewer is a tenant's name, or null for an admin:
 *   - an admin writes and is shown keys (`python`, `alice/app`);
 *   - a tenant writes and is shown plain tags. `NAME` reads its own (`T/NAME`, else a legacy
 *     NAME of its own), else the shared NAME; `T/NAME` is the same as NAME, another tenant's
 *     `U/NAME` never exists for it. It creates NAME in its own namespace: never a reserved name
 *     (refused the same whether or not it exists) nor one a shared snapshot holds (those it sees
 *     anyway). Nothing it is answered depends on another namespace than its own and the shared
 *     snapshots.
 * A reserved name is one no tenant's namespace may hold (E2B's SDK defaults, and the operator's
 * FORKD_RESERVED_TAGS), so those names always read the admins' shared snapshot.
 */
import { ForkdError } from "../util/index.js";
import { TENANT_RE, assertKey, isValidTag } from "../util/index.js";

/** A tenant's name, or null: an admin. */
export type Viewer = string | null;

/**
 * Names no tenant may take: E2B's SDKs' defaults (`base`; the code interpreter's
 * `code-interpreter-v1`; the desktop SDK's `desktop`), which every tenant's SDK asks for. forkd's
 * own SDKs' `default` is not among them: a tenant that finds no shared `default` makes its own,
 * in its namespace.
 */
export const DEFAULT_RESERVED_TAGS: readonly string[] = ["base", "code-interpreter-v1", "desktop"];

/** A key's namespace (null: the admins') and its name. */
export function splitKey(key: string): { ns: string | null; name: string } {
  const slash = key.indexOf("/");
  return slash < 0 ? { ns: null, name: key } : { ns: key.slice(0, slash), name: key.slice(slash + 1) };
}

/** The key of `name` in namespace `ns` (null: the admins'). */
export const keyIn = (ns: string | null, name: string): string => (ns === null ? name : `${ns}/${name}`);

/** The directory a key is stored in (a name under the store's root). */
export const keyDir = (key: string): string => assertKey(key).replace("/", "~");

/** The key stored in directory `name`, or null: not a snapshot's directory. */
export function keyOfDir(name: string): string | null {
  const tilde = name.indexOf("~");
  if (tilde < 0) return isValidTag(name) ? name : null;
  const ns = name.slice(0, tilde);
  const tag = name.slice(tilde + 1);
  return TENANT_RE.test(ns) && isValidTag(tag) ? `${ns}/${tag}` : null;
}

/** The tag `viewer` is shown for `key`: a tenant its own without their namespace, an admin the key. */
export function nameFor(viewer: Viewer, key: string): string {
  if (viewer === null) return key;
  const { ns, name } = splitKey(key);
  return ns === viewer ? name : key;
}

/**
 * FORKD_RESERVED_TAGS: comma-separated tags added to DEFAULT_RESERVED_TAGS ("-" alone: none of
 * the defaults either).
 */
export function reservedTags(raw: string | undefined): ReadonlySet<string> {
  const v = raw?.trim() ?? "";
  if (v === "-") return new Set();
  const out = new Set(DEFAULT_RESERVED_TAGS);
  for (const t of v
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean)) {
    if (!isValidTag(t)) throw new Error(`FORKD_RESERVED_TAGS: ${JSON.stringify(t)} is not a tag`);
    out.add(t);
  }
  return out;
}

/** What is at a key: its owner (null: shared) and whether it is ready, being written or failed. */
export interface KeyEntry {
  owner: string | null;
  status: "ready" | "writing" | "failed";
}

/** What the namespaces need of the store. */
export interface KeyLookup {
  /** What is at `key`, or undefined: nothing. */
  lookup(key: string): Promise<KeyEntry | undefined>;
}

/** Whether `viewer` may see the snapshot at `key`, owned by `owner`. */
export function visibleTo(viewer: Viewer, key: string, owner: string | null | undefined): boolean {
  if (viewer === null) return true;
  const { ns } = splitKey(key);
  if (ns !== null) return ns === viewer;
  return owner === null || owner === undefined || owner === viewer;
}

/**
 * Of the keys `viewer` may see (`all`, with their owners), those it is shown: a shared snapshot
 * whose tag it also holds itself (the admins published it after it had made its own) is hidden,
 * so each tag it is shown is one snapshot.
 */
export function shownTo<T>(
  viewer: Viewer,
  all: T[],
  keyOf: (x: T) => string,
  ownerOf: (x: T) => string | null | undefined,
): T[] {
  const visible = all.filter((x) => visibleTo(viewer, keyOf(x), ownerOf(x)));
  if (viewer === null) return visible;
  const own = new Set(
    visible
      .map(keyOf)
      .filter((k) => splitKey(k).ns === viewer)
      .map((k) => splitKey(k).name),
  );
  return visible.filter((x) => splitKey(keyOf(x)).ns !== null || !own.has(keyOf(x)));
}

const invalid = (tag: string, why: string) =>
  new ForkdError("invalid_argument", `invalid tag ${JSON.stringify(tag)}: ${why}`, { field: "tag", tag });

export class Namespaces {
  constructor(
    private readonly store: KeyLookup,
    readonly reserved: ReadonlySet<string>,
  ) {}

  /** Whether `name` is reserved: no tenant's namespace holds it. */
  isReserved(name: string): boolean {
    return this.reserved.has(name);
  }

  /** The name `tag` has in `viewer`'s own namespace, or null: `tag` is in another tenant's. */
  private own(viewer: string, tag: string): string | null {
    const { ns, name } = splitKey(assertKey(tag));
    return ns === null || ns === viewer ? name : null;
  }

  /**
   * The key `tag` reads for `viewer` (a snapshot there ready, being written or failed), or null:
   * there is none it may see.
   */
  async find(viewer: Viewer, tag: string): Promise<string | null> {
    if (viewer === null) return (await this.store.lookup(assertKey(tag))) === undefined ? null : tag;
    const name = this.own(viewer, tag);
    if (name === null) return null;
    const mine = keyIn(viewer, name);
    if ((await this.store.lookup(mine)) !== undefined) return mine;
    const plain = await this.store.lookup(name);
    return plain !== undefined && (plain.owner === null || plain.owner === viewer) ? name : null;
  }

  /**
   * The key a new snapshot `tag` of `viewer`'s gets: refused when the name is reserved for a
   * tenant (403, whether or not it exists), when `viewer` holds it ready already or a shared
   * snapshot holds it ready or being written (409: both are `viewer`'s to see), or when it names
   * another tenant's namespace (400). A tag being written or failed in `viewer`'s own namespace
   * is left to the store's claim (a conflict, or a failure record replaced).
   */
  async forNew(viewer: Viewer, tag: string): Promise<string> {
    const { ns, name } = splitKey(assertKey(tag));
    if (viewer === null) {
      if (ns !== null) return this.forNewIn(ns, name);
      if ((await this.store.lookup(name))?.status === "ready")
        throw new ForkdError("conflict", `snapshot ${name} already exists`, { tag: name });
      return name;
    }
    if (ns !== null && ns !== viewer) throw invalid(tag, "a tag of yours is named without a namespace");
    return this.forNewIn(viewer, name);
  }

  /** The key of a new snapshot `name` in tenant `ns`'s namespace (errors told as `ns` names it). */
  async forNewIn(ns: string, name: string): Promise<string> {
    if (this.isReserved(name))
      throw new ForkdError(
        "forbidden",
        `tag ${name} is reserved for the operator's shared snapshots; choose another`,
        { tag: name },
      );
    const key = keyIn(ns, name);
    const mine = await this.store.lookup(key);
    const plain = mine === undefined ? await this.store.lookup(name) : undefined;
    if (mine?.status === "ready")
      throw new ForkdError("conflict", `snapshot ${name} already exists`, { tag: name });
    // One of its own from before namespaces (legacy): where it is, even failed (deleted first).
    if (plain?.owner === ns)
      throw new ForkdError(
        "conflict",
        `snapshot ${name} already exists${plain.status === "failed" ? " (failed: delete it first)" : ""}`,
        { tag: name },
      );
    if (plain?.owner === null && plain.status !== "failed")
      throw new ForkdError("conflict", `a shared snapshot is tagged ${name}; choose another tag`, {
        tag: name,
      });
    return key;
  }

  /** The key a pack's snapshot `tag` has for `viewer` (what it sees under that tag), else gets. */
  async place(viewer: Viewer, tag: string): Promise<string> {
    return (await this.find(viewer, tag)) ?? this.forNew(viewer, tag);
  }
}
