/** Runs a load now and every `everyMs` while mounted (and when `key` changes); keeps its last value and error. */
import { useCallback, useEffect, useState } from "preact/hooks";
import { messageOf } from "../api/http";

export interface Polled<T> {
  value: T | undefined;
  error: string | null;
  reload: () => void;
}

export function usePoll<T>(load: () => Promise<T>, everyMs: number, key: string): Polled<T> {
  const [value, setValue] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | null>(null);
  const [tick, setTick] = useState(0);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  useEffect(() => {
    let live = true;
    load().then(
      (v) => {
        if (!live) return;
        setValue(v);
        setError(null);
      },
      (e: unknown) => {
        if (live) setError(messageOf(e));
      },
    );
    const t = everyMs > 0 ? setInterval(() => setTick((x) => x + 1), everyMs) : undefined;
    return () => {
      live = false;
      if (t !== undefined) clearInterval(t);
    };
    // `load` is made anew each render; `key` names what it loads.
  }, [key, tick, everyMs]);
  return { value, error, reload };
}
