/**
 * Whether the server is a cluster gateway whose nodes this caller may see (the navigation shows
 * Nodes only then): GET /v1/nodes asked once logged in; a 404 (one daemon) or a 403 (a tenant)
 * is a final no, any other failure is asked again after a while.
 */
import { useEffect, useState } from "preact/hooks";
import { loadNodes } from "../api/nodes";

const RETRY_MS = 15_000;

export function useCluster(loggedIn: boolean): boolean {
  const [cluster, setCluster] = useState(false);
  useEffect(() => {
    setCluster(false);
    if (!loggedIn) return;
    let live = true;
    let retry: ReturnType<typeof setTimeout> | undefined;
    const ask = () => {
      loadNodes().then(
        (a) => {
          if (live) setCluster(a.kind === "nodes");
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
  }, [loggedIn]);
  return cluster;
}
