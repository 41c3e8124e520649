"""E2B's SandboxPaginator and SandboxQuery over forkd's GET /v1/sandboxes (state, metadata, limit,
next_token). Filters are also applied here, so a daemon that ignores them still answers right."""

from urllib.parse import urlencode


class SandboxQuery:
    """metadata: pairs every listed sandbox has; state: the states to list ("running", "paused")."""

    def __init__(self, metadata=None, state=None):
        self.metadata = dict(metadata or {})
        self.state = [state] if isinstance(state, str) else list(state or [])

    @classmethod
    def of(cls, q):
        if q is None:
            return cls()
        if isinstance(q, cls):
            return cls(q.metadata, q.state)
        if isinstance(q, dict):
            return cls(q.get("metadata"), q.get("state"))
        return cls(getattr(q, "metadata", None), getattr(q, "state", None))

    def params(self):
        p = {}
        if self.state:
            p["state"] = ",".join(str(getattr(s, "value", s)) for s in self.state)
        if self.metadata:
            p["metadata"] = urlencode(self.metadata)
        return p

    def matches(self, w):
        states = [str(getattr(s, "value", s)) for s in self.state]
        if states and w["state"] not in states:
            return False
        return all(w["metadata"].get(k) == v for k, v in self.metadata.items())


class SandboxPaginator:
    """has_next, next_token, next_items() as in E2B; iterating it (or len(), indexing) reads every
    remaining page once, so code written for a plain list keeps working."""

    def __init__(self, transport, query, limit=None, next_token=None, info=None):
        self._t = transport
        self._query = query
        self._limit = limit
        self.next_token = next_token
        self._has_next = True
        self._info = info
        self._all = None

    @property
    def has_next(self):
        return self._has_next

    def next_items(self):
        if not self._has_next:
            raise StopIteration("no more sandboxes: check has_next first")
        q = self._query.params()
        if self._limit:
            q["limit"] = int(self._limit)
        if self.next_token:
            q["next_token"] = self.next_token
        r = self._t.json("GET", "/v1/sandboxes", query=q)
        self.next_token = r.get("next_token")
        self._has_next = bool(self.next_token)
        return [self._info(w) for w in r["sandboxes"] if self._query.matches(w)]

    def _everything(self):
        if self._all is None:
            out = []
            while self._has_next:
                out.extend(self.next_items())
            self._all = out
        return self._all

    def __iter__(self):
        return iter(self._everything())

    def __len__(self):
        return len(self._everything())

    def __getitem__(self, i):
        return self._everything()[i]
