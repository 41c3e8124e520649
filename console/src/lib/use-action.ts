/** Runs a user action (a button's API call), keeping what the page says about it: busy, done, or its error. */
import { useState } from "preact/hooks";
import { messageOf } from "../api/http";

export interface Action {
  busy: boolean;
  message: string | null;
  error: boolean;
  run: (what: string, fn: () => Promise<string | void>) => Promise<void>;
}

export function useAction(): Action {
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState<string | null>(null);
  const [error, setError] = useState(false);
  const run = async (what: string, fn: () => Promise<string | void>) => {
    setBusy(true);
    setError(false);
    setMessage(`${what}…`);
    try {
      const done = await fn();
      setMessage(done ?? `${what}: done`);
    } catch (e) {
      setError(true);
      setMessage(`${what}: ${messageOf(e)}`);
    } finally {
      setBusy(false);
    }
  };
  return { busy, message, error, run };
}
