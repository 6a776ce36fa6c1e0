"""The one error type for bad files: it names the file, the field and what was expected."""


class FormatError(ValueError):
    """A graph, plan or profile that does not match its format."""

    def __init__(self, source: str, field: str, expected: str, got: object = None):
        self.source = source
        self.field = field
        self.expected = expected
        detail = "" if got is None else f", got {_short(got)}"
        super().__init__(f"{source}: field '{field}': expected {expected}{detail}")


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
