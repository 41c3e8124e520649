"""sandbox.pty: E2B's pseudo-terminals (create, send_stdin, resize, kill) over forkd's exec with
`pty: {rows, cols}` and POST /v1/sandboxes/{id}/commands/{pid}/resize (the agent helper's routes).
Output arrives as bytes: handle.wait(on_pty=...) or iterating the handle ((None, None, bytes))."""

from .errors import NotFoundError


class PtySize:
    def __init__(self, rows, cols):
        self.rows = rows
        self.cols = cols

    def __repr__(self):
        return "PtySize(rows=%r, cols=%r)" % (self.rows, self.cols)


class Pty:
    def __init__(self, commands, transport, sandbox_id):
        self._commands = commands
        self._t = transport
        self._id = sandbox_id

    def create(self, size, user=None, cwd=None, envs=None, timeout=60, on_data=None, request_timeout=None):
        """Starts a login shell (bash -i -l, else sh) on a terminal of `size` (PtySize or
        {"rows", "cols"}); returns its CommandHandle at once (stdin stays open)."""
        rows, cols = (size["rows"], size["cols"]) if isinstance(size, dict) else (size.rows, size.cols)
        cmd = "if command -v bash >/dev/null; then exec bash -i -l; else exec sh -i; fi"
        return self._commands._start(cmd, envs=envs, user=user, cwd=cwd, timeout=timeout, stdin=True,
                                     pty={"rows": int(rows), "cols": int(cols)}, on_pty=on_data)

    def send_stdin(self, pid, data, request_timeout=None):
        """Input to the terminal (bytes; b"\\x03" is Ctrl-C)."""
        self._commands.send_stdin(pid, data)

    def send_input(self, pid, data, request_timeout=None):
        """E2B's JS name for send_stdin."""
        self._commands.send_stdin(pid, data)

    def resize(self, pid, size, request_timeout=None):
        rows, cols = (size["rows"], size["cols"]) if isinstance(size, dict) else (size.rows, size.cols)
        self._t.json("POST", "/v1/sandboxes/%s/commands/%d/resize" % (self._id, pid),
                     json_body={"rows": int(rows), "cols": int(cols)})

    def kill(self, pid, request_timeout=None):
        """SIGKILLs the terminal's process group. False if it is not running."""
        try:
            return self._commands.kill(pid)
        except NotFoundError:
            return False
