/** The console's hash routes: #/sandboxes, #/snapshots, #/sandboxes/ID, #/nodes and #/host. */

export type Route =
  | { page: "sandboxes" }
  | { page: "snapshots"; tag?: string }
  | { page: "sandbox"; id: string }
  | { page: "nodes" }
  | { page: "host" };

/** A malformed escape (a hand-typed `%E0`) is taken as it is, never thrown. */
const decode = (p: string): string => {
  try {
    return decodeURIComponent(p);
  } catch {
    return p;
  }
};

export function parseRoute(hash: string): Route {
  const parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decode);
  const [first, second] = parts;
  if (first === "sandboxes" && second) return { page: "sandbox", id: second };
  if (first === "snapshots") return second ? { page: "snapshots", tag: second } : { page: "snapshots" };
  if (first === "nodes") return { page: "nodes" };
  if (first === "host") return { page: "host" };
  return { page: "sandboxes" };
}

export function hrefOf(r: Route): string {
  switch (r.page) {
    case "sandboxes":
      return "#/sandboxes";
    case "snapshots":
      return r.tag ? `#/snapshots/${encodeURIComponent(r.tag)}` : "#/snapshots";
    case "sandbox":
      return `#/sandboxes/${encodeURIComponent(r.id)}`;
    case "nodes":
      return "#/nodes";
    case "host":
      return "#/host";
  }
}
