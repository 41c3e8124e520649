"""E2B's home layout in a forkd sandbox: which user commands run as by default and where homes are.

E2B's templates have an account `user` (home /home/user) that commands run as and that relative
file paths resolve against. forkd's own templates have only root. One probe per Sandbox object,
on first need, reads the image's /etc/passwd: `user` is the default when the image has it, else
the image's own default user (root in forkd's templates, home /root).
"""

import base64
import posixpath
import threading

# Prints "default NAME HOME" for the image's default user, then "NAME HOME" for each account.
_PROBE = ('printf "default %s %s\\n" "$(id -un 2>/dev/null || echo root)" "${HOME:-/}"; '
          'while IFS=: read -r n _ _ _ _ d _; do [ -d "$d" ] && printf "%s %s\\n" "$n" "$d"; done < /etc/passwd')

E2B_USER = "user"


def parse_probe(text):
    """(default user, {name: home}) from the probe's output."""
    homes = {}
    default = None
    for line in text.splitlines():
        parts = line.split(" ")
        if parts[0] == "default" and len(parts) >= 3:
            default = (parts[1], " ".join(parts[2:]))
        elif len(parts) >= 2 and parts[0]:
            homes[parts[0]] = " ".join(parts[1:])
    if E2B_USER in homes:
        return E2B_USER, homes
    name, home = default or ("root", "/root")
    homes.setdefault(name, home)
    return name, homes


def exec_output(t, sandbox_id, cmd, user="root"):
    """The stdout of a short helper command (as root unless told), "" if it could not run."""
    out = []
    body = {"cmd": cmd, "timeout_ms": 30000}
    if user is not None:
        body["user"] = user
    for ev in t.ndjson("POST", "/v1/sandboxes/%s/exec/stream" % sandbox_id, json_body=body):
        if ev.get("type") == "stdout":
            out.append(base64.b64decode(ev["data"]))
        elif ev.get("type") in ("exit", "error"):
            break
    return b"".join(out).decode("utf-8", "replace")


class Layout:
    """The default user and the homes of a sandbox's image, probed once (thread-safe)."""

    def __init__(self, transport, sandbox_id):
        self._t = transport
        self._id = sandbox_id
        self._lock = threading.Lock()
        self._probed = None

    def _probe(self):
        with self._lock:
            if self._probed is None:
                self._probed = parse_probe(exec_output(self._t, self._id, _PROBE, user=None))
            return self._probed

    @property
    def user(self):
        """The user commands and file operations act as when none is given."""
        return self._probe()[0]

    def home(self, user=None):
        """The home of `user` (default: the default user); None for an account the image lacks."""
        name, homes = self._probe()
        return homes.get(user or name)

    def resolve(self, path, user=None):
        """An absolute path: a relative one joined to the user's home (E2B's rule)."""
        if path.startswith("/"):
            return path
        home = self.home(user) or "/"
        return posixpath.normpath(posixpath.join(home, path)) if path else home
