/**
 * Whether the server is a cluster gateway whose nodes this caller may see (the navigation shows
 * Nodes only then): an admin's console asks GET /v1/health once logged in, whose `cluster` only
 * a gateway gives (so a lone daemon's console asks nothing that answers 404); a failure is
 * asked again after a while.
 */
import { useEffect, useState } from "preact/hooks";
import { health } from "../api/host";

const RETRY_MS = 15_000;

export function useCluster(admin: boolean): boolean {
  const [cluster, setCluster] = useState(false);
  useEffect(() => {
    setCluster(false);
    if (!admin) return;
    let live = true;
    let retry: ReturnType<typeof setTimeout> | undefined;
    const ask = () => {
      health().then(
        (h) => {
          if (live) setCluster(h.cluster !== undefined);
        },
        () => {
          if (live) retry = setTimeout(ask, RETRY_MS);
        },
      );
    };
    ask();
    return () => {
      live = false;
      clearTimeout(retry);
    };
  }, [admin]);
  return cluster;
}
