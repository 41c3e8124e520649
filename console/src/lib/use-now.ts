/** The current time, refreshed every few seconds, for ages in the tables. */
import { useEffect, useState } from "preact/hooks";

export function useNow(everyMs = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), everyMs);
    return () => clearInterval(t);
  }, [everyMs]);
  return now;
}
