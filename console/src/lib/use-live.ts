/** The live state hook: subscribes to the event stream for the app's lifetime and folds its events. */
import { useEffect, useReducer } from "preact/hooks";
import { subscribe } from "../api/events";
import { applyEvent, EMPTY } from "./live-state";
import type { LiveState } from "./live-state";

export function useLive(): LiveState {
  const [state, dispatch] = useReducer(applyEvent, EMPTY);
  useEffect(() => subscribe(dispatch), []);
  return state;
}
