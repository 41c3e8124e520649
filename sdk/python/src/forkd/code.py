"""Code-interpreter results, shaped like E2B's: Execution, Result, ExecutionError, Logs."""


class ExecutionError:
    def __init__(self, name, value, traceback):
        self.name = name
        self.value = value
        self.traceback = traceback

    def __repr__(self):
        return "ExecutionError(name=%r, value=%r)" % (self.name, self.value)


class Logs:
    def __init__(self, stdout=None, stderr=None):
        self.stdout = stdout or []
        self.stderr = stderr or []

    def __repr__(self):
        return "Logs(stdout=%r, stderr=%r)" % (self.stdout, self.stderr)


class Result:
    """One output of a cell: its final expression's value (is_main_result) or a displayed object."""

    def __init__(self, raw, is_main_result):
        self.raw = raw
        self.is_main_result = is_main_result
        self.text = raw.get("text/plain")
        self.html = raw.get("text/html")
        self.markdown = raw.get("text/markdown")
        self.svg = raw.get("image/svg+xml")
        self.png = raw.get("image/png")  # base64
        self.jpeg = raw.get("image/jpeg")  # base64
        self.latex = raw.get("text/latex")
        self.json = raw.get("application/json")
        self.javascript = raw.get("application/javascript")
        self.pdf = raw.get("application/pdf")
        self.data = raw.get("application/vnd.forkd.data+json")
        self.chart = raw.get("application/vnd.e2b.chart+json")

    def formats(self):
        return list(self.raw)

    def __repr__(self):
        return "Result(%s)" % ", ".join(self.formats())


class Context:
    """E2B's code Context: an interpreter state of its own (globals, cwd) in one language."""

    def __init__(self, id, language="python", cwd=None):
        self.id = id
        self.language = language
        self.cwd = cwd

    @classmethod
    def of(cls, w):
        return cls(w.get("id") or w.get("context_id"), w.get("language", "python"), w.get("cwd"))

    def __repr__(self):
        return "Context(id=%r, language=%r, cwd=%r)" % (self.id, self.language, self.cwd)


class Execution:
    def __init__(self, results=None, logs=None, error=None, execution_count=None):
        self.results = results or []
        self.logs = logs or Logs()
        self.error = error
        self.execution_count = execution_count

    @property
    def text(self):
        """The text of the main result (the cell's final expression), if there is one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    def to_json(self):
        return {"results": [r.raw for r in self.results],
                "logs": {"stdout": self.logs.stdout, "stderr": self.logs.stderr},
                "error": vars(self.error) if self.error else None,
                "execution_count": self.execution_count}

    def __repr__(self):
        return "Execution(results=%r, logs=%r, error=%r)" % (self.results, self.logs, self.error)


def execution_of(w):
    results = [Result(d, False) for d in (w.get("display") or [])]
    if w.get("value") is not None:
        raw = {"text/plain": w["value"]}
        raw.update(w.get("value_data") or {})
        results.append(Result(raw, True))
    err = w.get("error")
    return Execution(
        results,
        Logs([w["stdout"]] if w.get("stdout") else [], [w["stderr"]] if w.get("stderr") else []),
        ExecutionError(err["name"], err["value"], err["traceback"]) if err else None,
        w.get("execution_count"),
    )
