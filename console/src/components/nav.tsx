/** The top navigation: one link per page, the current one marked for assistive technology. */
import type { Route } from "../lib/route";

const LINKS = [
  { page: "sandboxes", href: "#/sandboxes", label: "Sandboxes" },
  { page: "snapshots", href: "#/snapshots", label: "Snapshots" },
  { page: "host", href: "#/host", label: "Host" },
] as const;

export function Nav({ route }: { route: Route }) {
  const current = route.page === "sandbox" ? "sandboxes" : route.page;
  return (
    <nav aria-label="Main">
      <span class="brand">forkd</span>
      <ul>
        {LINKS.map((l) => (
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
