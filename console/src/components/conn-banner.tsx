/** The banner shown while the event stream is down: the list may be stale and is being reconnected. */
export function ConnBanner({ connected }: { connected: boolean }) {
  if (connected) return null;
  return (
    <div class="banner" role="alert">
      connection lost — reconnecting
    </div>
  );
}
