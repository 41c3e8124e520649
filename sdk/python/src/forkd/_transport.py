"""HTTP to the forkd daemon: its unix socket by default, or a URL with a bearer token.

Standard library only (http.client): the SDK has no dependencies.
"""

import http.client
import json
import os
import socket
import urllib.parse

from .errors import ConnectionError, ForkdError, TimeoutError, error_from_envelope

DEFAULT_SOCKET = "/var/lib/forkd/forkd.sock"
_CHUNK = 1 << 20


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=None):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.timeout is not None:
                s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Transport:
    """One place that knows where the daemon is. Each request uses its own connection."""

    def __init__(self, url=None, token=None, socket_path=None, api_key=None, request_timeout=60.0):
        url = url if url is not None else os.environ.get("FORKD_URL")
        self.url = urllib.parse.urlsplit(url) if url else None
        self.socket_path = socket_path or os.environ.get("FORKD_SOCKET") or DEFAULT_SOCKET
        self.token = token or api_key or os.environ.get("FORKD_TOKEN")
        self.request_timeout = request_timeout

    @property
    def where(self):
        return "%s://%s" % (self.url.scheme, self.url.netloc) if self.url else "unix:" + self.socket_path

    @property
    def base_url(self):
        """The daemon's base URL (http+unix://<socket> on the unix socket)."""
        if self.url is None:
            return "http+unix://" + urllib.parse.quote(self.socket_path, safe="")
        return "%s://%s%s" % (self.url.scheme, self.url.netloc, self.url.path.rstrip("/"))

    def _connection(self, timeout):
        if self.url is None:
            return _UnixConnection(self.socket_path, timeout=timeout)
        cls = http.client.HTTPSConnection if self.url.scheme == "https" else http.client.HTTPConnection
        return cls(self.url.hostname, self.url.port, timeout=timeout)

    def send(self, method, path, query=None, json_body=None, body=None, timeout=None, headers=None):
        """Sends a request; returns (connection, response) for a 2xx reply, else raises the typed error.

        The caller reads the response and closes the connection.
        """
        if query:
            q = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
            if q:
                path += "?" + q
        if self.url is not None and self.url.path not in ("", "/"):
            path = self.url.path.rstrip("/") + path
        headers = dict(headers or {})
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        payload = None
        if json_body is not None:
            payload = json.dumps(json_body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        elif body is not None:
            headers["Content-Type"] = "application/octet-stream"
            payload = body
        if isinstance(payload, (bytes, bytearray, memoryview)):
            headers["Content-Length"] = str(len(payload))
        elif payload is not None:
            payload = _chunks(payload)  # http.client sends it chunked
        t = self.request_timeout if timeout is None else timeout
        conn = self._connection(t if t else None)
        try:
            conn.request(method, path, body=payload, headers=headers)
            res = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise TimeoutError("%s %s: no reply within %s s" % (method, path, t), code="timeout") from e
        except OSError as e:
            conn.close()
            raise ConnectionError("cannot reach the forkd daemon at %s: %s" % (self.where, e),
                                  code="connection") from e
        if 200 <= res.status < 300:
            return conn, res
        text = res.read().decode("utf-8", errors="replace")
        conn.close()
        env = {}
        try:
            env = json.loads(text).get("error") or {}
        except ValueError:
            pass
        raise error_from_envelope(res.status, env.get("code", "internal"),
                                  env.get("message") or text or "HTTP %d" % res.status, env.get("details"))

    def json(self, method, path, **kw):
        conn, res = self.send(method, path, **kw)
        try:
            return json.loads(res.read().decode("utf-8"))
        finally:
            conn.close()

    def bytes(self, method, path, **kw):
        conn, res = self.send(method, path, **kw)
        try:
            return res.read()
        finally:
            conn.close()

    def ndjson(self, method, path, **kw):
        """Yields each event of an NDJSON reply as it arrives."""
        kw.setdefault("timeout", 0)
        conn, res = self.send(method, path, **kw)
        try:
            buf = b""
            while True:
                chunk = res.read1(65536) if hasattr(res, "read1") else res.read(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
            if buf.strip():
                yield json.loads(buf)
        except socket.timeout as e:
            raise TimeoutError("%s %s: stream stalled" % (method, path), code="timeout") from e
        except (OSError, http.client.HTTPException) as e:
            raise ForkdError("the stream from the daemon broke: %s" % e, code="connection") from e
        finally:
            conn.close()


def _chunks(stream):
    """Bytes from a file-like object or an iterable, never empty (an empty chunk ends the body)."""
    read = getattr(stream, "read", None)
    for c in iter(lambda: read(_CHUNK), b"") if read else iter(stream):
        if isinstance(c, str):
            c = c.encode("utf-8")
        if c:
            yield bytes(c)
