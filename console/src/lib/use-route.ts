/** The current hash route, updated on every hashchange. */
import { useEffect, useState } from "preact/hooks";
import { parseRoute } from "./route";
import type { Route } from "./route";

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location.hash));
  useEffect(() => {
    const on = () => setRoute(parseRoute(location.hash));
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return route;
}
