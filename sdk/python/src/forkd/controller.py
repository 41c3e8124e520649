"""Controller: the daemon's snapshots, health and version."""

from urllib.parse import quote

from ._transport import Transport
from .errors import ForkdError
from .sandbox import fork as _fork_fn


def _tag(tag):
    # a tag in the URL's path: an admin's TENANT/TAG encoded as one segment
    return "/v1/snapshots/" + quote(tag, safe="")


class Controller:
    def __init__(self, url=None, token=None, socket_path=None, api_key=None, request_timeout=60.0):
        self._conn = dict(url=url, token=token, socket_path=socket_path, api_key=api_key)
        self._t = Transport(request_timeout=request_timeout, **self._conn)

    def health(self):
        return self._t.json("GET", "/v1/health")

    def version(self):
        return self._t.json("GET", "/v1/version")

    def list_snapshots(self):
        return self._t.json("GET", "/v1/snapshots")["snapshots"]

    def get_snapshot(self, tag):
        return self._t.json("GET", _tag(tag))

    def create_snapshot(self, tag, template=None, warm=None, warm_eval=None, memory_mib=None, vcpus=None,
                        on_progress=None, image=None, start_cmd=None, ready_cmd=None, ready_timeout_ms=None,
                        warm_eval_language=None):
        """Boots a parent VM, warms it (warm: shell command; warm_eval: a cell whose globals every
        child inherits, run in the kernel warm_eval_language names: "python", the default, or
        "javascript") and freezes it. Returns the snapshot's metadata. image: an OCI/Docker
        reference booted instead of a template; start_cmd is started in the background and
        ready_cmd run until it exits 0 before the freeze (a server up in every child)."""
        body = {"tag": tag}
        for k, v in (("template", template), ("image", image), ("start_cmd", start_cmd),
                     ("ready_cmd", ready_cmd), ("ready_timeout_ms", ready_timeout_ms), ("warm", warm),
                     ("warm_eval", warm_eval), ("memory_mib", memory_mib), ("vcpus", vcpus)):
            if v is not None:
                body[k] = v
        # sent only when not python, so a daemon from before the field takes Python warm-ups
        if warm_eval_language is not None and warm_eval_language != "python":
            body["warm_eval_language"] = warm_eval_language
        done = None
        for ev in self._t.ndjson("POST", "/v1/snapshots", query={"stream": 1}, json_body=body):
            if ev["type"] == "progress":
                if on_progress:
                    on_progress(ev["message"])
            elif ev["type"] == "done":
                done = ev["snapshot"]
            else:
                e = ev["error"]
                raise ForkdError(e["message"], code=e["code"], details=e.get("details"))
        if done is None:
            raise ForkdError("snapshot stream ended without a result", code="connection")
        return done

    def delete_snapshot(self, tag):
        self._t.json("DELETE", _tag(tag))

    def fork(self, snapshot, n, timeout=None, metadata=None, network=None):
        return _fork_fn(snapshot, n, timeout=timeout, metadata=metadata, network=network, **self._conn)
