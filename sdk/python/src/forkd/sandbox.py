"""Sandbox: one forked microVM, shaped like E2B's Sandbox (timeouts in seconds, as in E2B's Python SDK)."""

import os
import time
from datetime import datetime

from ._transport import Transport
from .code import execution_of
from .commands import Commands
from .errors import ConflictError, ForkdError, InvalidArgumentError, NotFoundError
from .files import Files

DEFAULT_SNAPSHOT = "default"
# the kernels a sandbox can have (which ones an image has depends on its interpreters)
LANGUAGES = ("python", "javascript")


def _when(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")) if s else None


class SandboxInfo:
    def __init__(self, w):
        self.sandbox_id = w["id"]
        self.snapshot = w["tag"]
        self.template_id = w["tag"]  # E2B's name
        self.pid = w["pid"]
        self.state = w["state"]
        self.started_at = _when(w["created"])
        self.exit_reason = w["exit_reason"]
        self.timeout = w["timeout_ms"] / 1000 if w["timeout_ms"] is not None else None
        # When it will be killed: its idle timeout unless it is used first, or its lifetime's end.
        ends = [t for t in (_when(w["expires_at"]), _when(w.get("ends_at"))) if t is not None]
        self.end_at = min(ends) if ends else None
        # {"memory_mib", "cpus", "pids", "disk_mib", "lifetime_ms"}: the host-side limits in force.
        self.limits = w.get("limits") or {}
        self.metadata = w["metadata"]
        # {"launch_ms", "restore_ms", "ready_ms", "total_ms"}: the fork as the daemon measured it.
        self.timings = w["timings"]
        net = w.get("network") or {"mode": "none", "guest_ip": None, "egress": None, "ports": []}
        # {"mode", "guest_ip", "egress", "ports": [{"port", "host"}]}: exposed ports while it runs.
        self.network = net

    def __repr__(self):
        return "SandboxInfo(sandbox_id=%r, snapshot=%r, state=%r)" % (self.sandbox_id, self.snapshot, self.state)


def _transport(url=None, token=None, socket_path=None, api_key=None, request_timeout=None):
    return Transport(url=url, token=token, socket_path=socket_path, api_key=api_key,
                     request_timeout=60.0 if request_timeout is None else request_timeout)


class _class_or_instance:
    """A method callable on the class (with a sandbox id) or on an instance, like E2B's kill()."""

    def __init__(self, cls_fn, inst_fn):
        self.cls_fn = cls_fn
        self.inst_fn = inst_fn

    def __get__(self, obj, cls):
        if obj is None:
            return lambda *a, **kw: self.cls_fn(cls, *a, **kw)
        return lambda *a, **kw: self.inst_fn(obj, *a, **kw)


class Sandbox:
    """Sandbox(snapshot=None, ...) forks a new child (E2B: Sandbox(template=None, ...)).

    `with Sandbox() as sb:` kills it on exit. Without a snapshot, $FORKD_SNAPSHOT or "default"
    (created from the python template on first use) is forked.
    """

    def __init__(self, template=None, timeout=None, metadata=None, envs=None, api_key=None,
                 request_timeout=None, snapshot=None, url=None, token=None, socket_path=None,
                 sandbox_id=None, on_idle=None, limits=None, network=None, _transport_obj=None):
        self._t = _transport_obj or _transport(url, token, socket_path, api_key, request_timeout)
        self._envs = dict(envs or {})
        if sandbox_id is None:
            explicit = snapshot or template or os.environ.get("FORKD_SNAPSHOT")
            tag = explicit or DEFAULT_SNAPSHOT
            try:
                sandbox_id = _fork(self._t, tag, 1, timeout, metadata, on_idle, limits=limits, network=network)[0]
            except NotFoundError:
                if explicit:
                    raise
                _ensure_default(self._t)
                sandbox_id = _fork(self._t, tag, 1, timeout, metadata, on_idle, limits=limits, network=network)[0]
        self.sandbox_id = sandbox_id
        self.commands = Commands(self._t, sandbox_id)
        self.files = Files(self._t, sandbox_id)

    @classmethod
    def create(cls, template=None, **kw):
        """Same as Sandbox(...): forks a new child."""
        return cls(template, **kw)

    @classmethod
    def connect(cls, sandbox_id, url=None, token=None, socket_path=None, api_key=None, request_timeout=None):
        t = _transport(url, token, socket_path, api_key, request_timeout)
        w = t.json("GET", "/v1/sandboxes/%s" % _quote(sandbox_id))
        if w["state"] != "running":
            raise ConflictError("sandbox %s is not running (%s)" % (sandbox_id, w["exit_reason"] or w["state"]),
                                code="conflict", status=409)
        return cls(sandbox_id=w["id"], _transport_obj=t)

    @classmethod
    def resume(cls, sandbox_id, url=None, token=None, socket_path=None, api_key=None):
        """Brings a paused sandbox back: same id, files and processes."""
        t = _transport(url, token, socket_path, api_key)
        w = t.json("POST", "/v1/sandboxes/%s/resume" % _quote(sandbox_id), timeout=0)
        return cls(sandbox_id=w["id"], _transport_obj=t)

    def pause(self):
        """Saves the sandbox's whole state and stops its VM (freeing its memory);
        Sandbox.resume(id) brings it back, also after a daemon restart."""
        self._t.json("POST", "/v1/sandboxes/%s/pause" % self.sandbox_id, timeout=0)

    @classmethod
    def list(cls, metadata=None, state=None, url=None, token=None, socket_path=None, api_key=None):
        t = _transport(url, token, socket_path, api_key)
        out = []
        for w in t.json("GET", "/v1/sandboxes")["sandboxes"]:
            if metadata and any(w["metadata"].get(k) != v for k, v in metadata.items()):
                continue
            if state and w["state"] != state:
                continue
            out.append(SandboxInfo(w))
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def _kill_instance(self):
        return _kill(self._t, self.sandbox_id)

    def _kill_class(cls, sandbox_id, url=None, token=None, socket_path=None, api_key=None):
        return _kill(_transport(url, token, socket_path, api_key), sandbox_id)

    kill = _class_or_instance(_kill_class, _kill_instance)
    kill.__doc__ = "Kills the sandbox (Sandbox.kill(id) or sb.kill()). False if it was already gone."

    def _set_timeout_instance(self, timeout):
        self._t.json("POST", "/v1/sandboxes/%s/timeout" % self.sandbox_id,
                     json_body={"timeout_ms": None if timeout is None else int(timeout * 1000)})

    def _set_timeout_class(cls, sandbox_id, timeout, **kw):
        cls(sandbox_id=sandbox_id, _transport_obj=_transport(**kw))._set_timeout_instance(timeout)

    set_timeout = _class_or_instance(_set_timeout_class, _set_timeout_instance)
    set_timeout.__doc__ = "Sets the idle timeout in seconds, counted from now (None: never)."

    def _get_info_instance(self):
        return SandboxInfo(self._t.json("GET", "/v1/sandboxes/%s" % self.sandbox_id))

    def _get_info_class(cls, sandbox_id, url=None, token=None, socket_path=None, api_key=None):
        t = _transport(url, token, socket_path, api_key)
        return SandboxInfo(t.json("GET", "/v1/sandboxes/%s" % _quote(sandbox_id)))

    get_info = _class_or_instance(_get_info_class, _get_info_instance)
    get_info.__doc__ = "A sandbox's state (Sandbox.get_info(id) or sb.get_info()), also one that exited."

    def get_host(self, port):
        """Where guest TCP port `port` answers on the host, as "host:port" (E2B: get_host(port)). A port
        not exposed yet is exposed now (the sandbox needs a network: mode user or netns)."""
        for p in self.get_info().network.get("ports") or []:
            if p["port"] == port:
                return p["host"]
        return self.expose(port)

    def unexpose(self, port):
        """Stops exposing guest TCP port `port` on the host."""
        self._t.json("DELETE", "/v1/sandboxes/%s/ports/%d" % (self.sandbox_id, int(port)))

    def set_egress(self, egress):
        """Replaces the egress policy while it runs, e.g. {"mode": "deny"} once dependencies are
        installed (network netns, or user created with egress allow or list)."""
        self._t.json("POST", "/v1/sandboxes/%s/egress" % self.sandbox_id, json_body=dict(egress))

    def expose(self, port):
        """Exposes guest TCP port `port` on the host while the sandbox lives; returns "host:port"."""
        w = self._t.json("POST", "/v1/sandboxes/%s/ports" % self.sandbox_id, json_body={"port": int(port)})
        for p in (w.get("network") or {}).get("ports") or []:
            if p["port"] == port:
                return p["host"]
        raise InvalidArgumentError("port %s was not exposed" % port, code="invalid_argument")

    def is_running(self):
        try:
            return self.get_info().state == "running"
        except NotFoundError:
            return False

    def branch(self, tag=None, wait=True):
        """BRANCH: snapshots this running sandbox (memory, disk, processes, interpreter state) with a
        short pause, as a new snapshot tag to fork. Returns BranchInfo(tag, status, pause_ms,
        private_bytes); with wait=False it returns once the sandbox runs again ("writing")."""
        body = {"wait": bool(wait)}
        if tag:
            body["tag"] = tag
        r = self._t.json("POST", "/v1/sandboxes/%s/branch" % self.sandbox_id, json_body=body, timeout=0)
        return BranchInfo(r["tag"], r["status"], r["pause_ms"], r["private_bytes"])

    def run_code(self, code, language=None, on_stdout=None, on_stderr=None, timeout=60, request_timeout=None):
        """Runs a notebook cell in the warm interpreter: statements run, the final expression's value
        is the main result, globals persist (a forked child inherits its parent's); errors come back
        in execution.error, not raised. language: "python" (default) or "javascript" (the Node
        kernel: needs node in the image, e.g. the node template); a language the image has no
        interpreter for raises UnavailableError (code "unavailable"). The field is
        sent only when it is not python, so Python cells also work against an older daemon."""
        language = language or "python"
        if language not in LANGUAGES:
            raise InvalidArgumentError("no %s kernel (known: %s)" % (language, ", ".join(LANGUAGES)),
                                       code="invalid_argument")
        t = timeout or 3600
        body = {"code": code, "timeout_ms": int(t * 1000)}
        if language != "python":
            body["language"] = language
        w = self._t.json("POST", "/v1/sandboxes/%s/eval" % self.sandbox_id,
                         json_body=body, timeout=request_timeout or t + 30)
        if w.get("stdout") and on_stdout:
            on_stdout(w["stdout"])
        if w.get("stderr") and on_stderr:
            on_stderr(w["stderr"])
        return execution_of(w)

    def __repr__(self):
        return "Sandbox(sandbox_id=%r)" % self.sandbox_id


class BranchInfo:
    def __init__(self, tag, status, pause_ms, private_bytes):
        self.tag = tag
        self.status = status
        self.pause_ms = pause_ms
        self.private_bytes = private_bytes

    def __repr__(self):
        return "BranchInfo(tag=%r, status=%r, pause_ms=%.1f)" % (self.tag, self.status, self.pause_ms)


class ForkError(ForkdError):
    """Some children of a fork failed; the ones that started are in .sandboxes (still running)."""

    def __init__(self, sandboxes, failures):
        super().__init__("%d of %d children failed: %s" % (
            len(failures), len(failures) + len(sandboxes), failures[0]["message"] if failures else ""),
            code="fork_partial", details={"failures": failures})
        self.sandboxes = sandboxes
        self.failures = failures


def _quote(s):
    from urllib.parse import quote
    return quote(s, safe="")


def _kill(t, sandbox_id):
    try:
        t.json("DELETE", "/v1/sandboxes/%s" % _quote(sandbox_id), timeout=60)
        return True
    except NotFoundError:
        return False


def _fork(t, tag, n, timeout=None, metadata=None, on_idle=None, limits=None, network=None):
    body = {"snapshot_tag": tag, "n": n}
    if limits:
        # {"memory_mib": ..., "cpus": ..., "pids": ..., "disk_mib": ...}: host-side limits (see the REST API).
        body["limits"] = dict(limits)
    if on_idle:
        body["on_idle"] = on_idle
    if network:
        body["network"] = dict(network)
    if timeout is not None:
        body["timeout_ms"] = int(timeout * 1000)
    if metadata:
        body["metadata"] = dict(metadata)
    r = t.json("POST", "/v1/sandboxes", json_body=body, timeout=0)
    ids = [s["id"] for s in r["sandboxes"]]
    if r["failures"]:
        raise ForkError([Sandbox(sandbox_id=i, _transport_obj=t) for i in ids], r["failures"])
    return ids


def _ensure_default(t):
    try:
        t.json("POST", "/v1/snapshots", json_body={"tag": DEFAULT_SNAPSHOT, "template": "python"}, timeout=0)
    except ConflictError:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:  # someone else is creating it
            try:
                t.json("GET", "/v1/snapshots/" + DEFAULT_SNAPSHOT)
                return
            except NotFoundError:
                time.sleep(1)
        raise


def fork(snapshot, n, timeout=None, metadata=None, url=None, token=None, socket_path=None, api_key=None,
         limits=None, network=None):
    """Forks n children of snapshot in one request (they start in parallel); returns them when every
    one answers. If some fail, raises ForkError whose .sandboxes holds the ones running.
    network: e.g. {"mode": "netns", "egress": {"mode": "deny"}, "expose": [8000]} (default none)."""
    t = _transport(url, token, socket_path, api_key)
    return [Sandbox(sandbox_id=i, _transport_obj=t)
            for i in _fork(t, snapshot, n, timeout, metadata, limits=limits, network=network)]
