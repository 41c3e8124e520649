"""verify_webhook: a webhook receiver's check of a forkd delivery (docs/webhooks.md).

`forkd-signature` is "v1=" + the hex HMAC-SHA256, under the webhook's secret, of
"<forkd-timestamp>.<raw body>"; the timestamp (unix seconds) must be recent, so a recorded delivery
cannot be replayed later. De-duplicate on the body's `id` (also `forkd-event-id`).
"""

import hashlib
import hmac
import re
import time


def verify_webhook(secret, headers, body, tolerance_s=300, now_s=None):
    """Whether a delivery is forkd's, unchanged: `headers` a mapping (any case of names), `body` the raw bytes."""
    lower = {str(k).lower(): v for k, v in dict(headers).items()}
    sig = lower.get("forkd-signature")
    ts = lower.get("forkd-timestamp")
    if isinstance(sig, (list, tuple)):
        sig = sig[0] if sig else None
    if isinstance(ts, (list, tuple)):
        ts = ts[0] if ts else None
    if not sig or not ts or not re.fullmatch(r"\d{1,12}", str(ts)):
        return False
    now = int(time.time()) if now_s is None else now_s
    if abs(now - int(ts)) > tolerance_s:
        return False
    raw = body.encode() if isinstance(body, str) else bytes(body)
    mac = hmac.new(secret.encode(), str(ts).encode() + b"." + raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(str(sig).encode(), ("v1=" + mac).encode())
