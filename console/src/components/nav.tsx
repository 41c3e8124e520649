/**
 * The top navigation: one link per page, the current one marked for assistive technology; Nodes
 * only on a cluster gateway whose nodes the caller may see.
 */
import type { Route } from "../lib/route";

const LINKS = [
  { page: "sandboxes", href: "#/sandboxes", label: "Sandboxes" },
  { page: "snapshots", href: "#/snapshots", label: "Snapshots" },
  { page: "nodes", href: "#/nodes", label: "Nodes" },
  { page: "host", href: "#/host", label: "Host" },
] as const;

export function Nav({ route, cluster }: { route: Route; cluster: boolean }) {
  const current = route.page === "sandbox" ? "sandboxes" : route.page;
  const links = LINKS.filter((l) => l.page !== "nodes" || cluster || current === "nodes");
  return (
    <nav aria-label="Main">
      <span class="brand">forkd</span>
      <ul>
        {links.map((l) => (
          <li key={l.page}>
            <a href={l.href} aria-current={current === l.page ? "page" : undefined}>
              {l.label}
            </a>
          </li>
        ))}
      </ul>
    </nav>
  );
}
