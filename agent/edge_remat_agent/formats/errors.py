"""The one error type for bad files: it names the file, the field and what was expected."""


class FormatError(ValueError):
    """A graph, plan or profile that does not match its format."""

    def __init__(self, source: str, field: str, expected: str, got: object = None,
                 advice: str = ""):
        self.source = source
        self.field = field
        self.expected = expected
        detail = "" if got is None else f", got {_short(got)}"
        todo = f": {advice}" if advice else ""
        super().__init__(f"{source}: field '{field}': expected {expected}{detail}{todo}")


def unreadable_file(path: object, exc: OSError, what: str = "file") -> FormatError:
    """The error for a file that cannot be opened (missing, a folder, not permitted), with
    what to do about it: every reader of the user's files says it alike."""
    import errno
    advice = {errno.ENOENT: "check the path",
              errno.EISDIR: f"give the {what} itself, not a folder",
              errno.EACCES: "check its permissions",
              errno.EPERM: "check its permissions"}.get(exc.errno,
                                                        "check the path and its permissions")
    return FormatError(str(path), "<file>", f"a readable {what}", exc.strerror or str(exc),
                       advice)


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
