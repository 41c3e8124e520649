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

    def formats(self):
        return list(self.raw)

    def __repr__(self):
        return "Result(%s)" % ", ".join(self.formats())


class Execution:
    def __init__(self, results=None, logs=None, error=None):
        self.results = results or []
        self.logs = logs or Logs()
        self.error = error

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
                "error": vars(self.error) if self.error else None}

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
    )
