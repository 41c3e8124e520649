/**
 * The console's shell: logs in with the one-time secret `forkd console`'s URL brought (in the
 * fragment, `#login=S`: never sent to a server, removed from the address at once), checks the
 * session, then the navigation (Nodes on a cluster gateway), the connection banner and the
 * current page.
 */
import { useEffect, useState } from "preact/hooks";
import { ApiError, messageOf } from "./api/http";
import { loginWithSecret, logout, whoami } from "./api/session";
import type { ConsoleCaller } from "./api/types";
import { ConnBanner } from "./components/conn-banner";
import { Nav } from "./components/nav";
import { useCluster } from "./lib/use-cluster";
import { useLive } from "./lib/use-live";
import { useRoute } from "./lib/use-route";
import { HostPage } from "./pages/host-page";
import { LoginPage } from "./pages/login-page";
import { NodesPage } from "./pages/nodes-page";
import { SandboxPage } from "./pages/sandbox-page";
import { SandboxesPage } from "./pages/sandboxes-page";
import { SnapshotsPage } from "./pages/snapshots-page";
import type { Route } from "./lib/route";
import type { LiveState } from "./lib/live-state";

type Session = "checking" | { in: ConsoleCaller["caller"] } | "out" | { error: string };

/** The one-time login secret in the address (`#login=S`), taken out of it; null: none. */
function takeLoginSecret(): string | null {
  const m = /^#login=([A-Za-z0-9_-]+)$/.exec(location.hash);
  if (!m) return null;
  history.replaceState(null, "", `${location.pathname}${location.search}#/sandboxes`);
  return m[1] ?? null;
}

/** Who is logged in, and the logout (the session ends on the server, then the login page). */
function Who({ caller, onOut }: { caller: ConsoleCaller["caller"]; onOut: () => void }) {
  const [busy, setBusy] = useState(false);
  const who =
    caller.kind === "local"
      ? "local admin"
      : `${caller.name}${caller.admin ? " (admin)" : ` (tenant ${caller.tenant ?? "?"})`}`;
  return (
    <div class="who">
      <span aria-label="Logged in as">{who}</span>{" "}
      <button
        type="button"
        disabled={busy}
        onClick={() => {
          setBusy(true);
          logout().then(onOut, onOut);
        }}
      >
        Log out
      </button>
    </div>
  );
}

function Page({ route, live }: { route: Route; live: LiveState }) {
  switch (route.page) {
    case "sandboxes":
      return <SandboxesPage live={live} />;
    case "snapshots":
      return <SnapshotsPage live={live} tag={route.tag} />;
    case "sandbox":
      return <SandboxPage key={route.id} live={live} id={route.id} />;
    case "nodes":
      return <NodesPage />;
    case "host":
      return <HostPage />;
  }
}

function LoggedIn({ route }: { route: Route }) {
  const live = useLive();
  return (
    <>
      <ConnBanner connected={live.connected} />
      <main id="main" tabIndex={-1}>
        <Page route={route} live={live} />
      </main>
    </>
  );
}

export function App() {
  const route = useRoute();
  const [session, setSession] = useState<Session>("checking");
  const [attempt, setAttempt] = useState(0);
  const cluster = useCluster(typeof session === "object" && "in" in session && session.in.admin);
  useEffect(() => {
    const secret = takeLoginSecret();
    (secret === null ? whoami() : loginWithSecret(secret)).then(
      (w) => setSession({ in: w.caller }),
      (e: unknown) => setSession(e instanceof ApiError && e.status === 401 ? "out" : { error: messageOf(e) }),
    );
  }, [attempt]);
  return (
    <>
      <button type="button" class="skip" onClick={() => document.getElementById("main")?.focus()}>
        Skip to content
      </button>
      <header>
        <Nav route={route} cluster={cluster} />
        {typeof session === "object" && "in" in session && (
          <Who caller={session.in} onOut={() => setSession("out")} />
        )}
      </header>
      {session === "checking" && <p>Loading…</p>}
      {session === "out" && <LoginPage onLogin={() => setAttempt((n) => n + 1)} />}
      {typeof session === "object" && "error" in session && (
        <p class="status error" role="alert">
          The daemon did not answer: {session.error}{" "}
          <button type="button" onClick={() => setAttempt((n) => n + 1)}>
            Retry
          </button>
        </p>
      )}
      {typeof session === "object" && "in" in session && <LoggedIn route={route} />}
    </>
  );
}
