"""The benchmark scripts' option values: argparse `type=` readers they share.

Each reader takes the option's text and returns its value, or raises ArgumentTypeError with a
message that names the text: argparse then prints "error: argument --x: MESSAGE" with the usage
and exits with status 2 while it parses, before any benchmark work starts (and with no
traceback). A string default goes through the same reader, so a default such as "0.9,0.8"
arrives as the list it reads as.

    parser.add_argument("--budgets", type=positive_floats, default="0.9,0.8,0.7")
    parser.add_argument("--models", type=names_among(MODELS, "model"))
"""

from __future__ import annotations

import math
import os
from argparse import ArgumentTypeError
from typing import Callable, Iterable, TypeVar

from edge_remat_agent.units import parse_size

T = TypeVar("T")


# -- single values ---------------------------------------------------------------------------

def int_at_least(least: int) -> Callable[[str], int]:
    """A whole number of at least `least` (steps a run needs, the nodes of a graph...)."""
    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}")
        return value
    return read


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def _finite_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):  # "inf" and "nan" read as floats, and mean no setting here
        raise ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (a time limit, a budget's fraction, a rate)."""
    value = _finite_number(text)
    if value <= 0:
        raise ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (a fraction where 0 has a meaning of its own)."""
    value = _finite_number(text)
    if value < 0:
        raise ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_float_or(*words: str) -> Callable[[str], str]:
    """One of `words` or a positive number, kept as written: a budget such as "0.5" or
    "floor" that also names the run's rows and files."""
    def read(text: str) -> str:
        if text in words:
            return text
        try:
            positive_float(text)
        except ArgumentTypeError:
            raise ArgumentTypeError(f"expected a number > 0 or {' or '.join(words)}, "
                                    f"got {text!r}") from None
        return text
    return read


def positive_size(text: str) -> int:
    """Bytes, written as 4096, 64MiB or 1.5GB (edge_remat_agent.units), above 0."""
    try:
        value = parse_size(text)
    except ValueError as error:  # its message names the text and the units it knows
        raise ArgumentTypeError(str(error)) from None
    if value <= 0:
        raise ArgumentTypeError(f"expected a size above 0 bytes, got {text!r}")
    return value


def existing_folder(text: str) -> str:
    """A folder that exists and this process may write in (every folder option here is
    where a script writes its pages, files or servers), kept as written."""
    if not os.path.isdir(text):
        why = "is not a folder" if os.path.exists(text) else "does not exist"
        raise ArgumentTypeError(f"{text!r} {why}")
    if not os.access(text, os.W_OK | os.X_OK):
        raise ArgumentTypeError(f"{text!r} is a folder this process may not write in")
    return text


def checked_by(parse: Callable[[str], object]) -> Callable[[str], str]:
    """The text itself, once `parse` (a project's own reader, whose ValueError names the text)
    accepts it: for a value that goes on as written, such as a budget "55%" in a manifest."""
    def read(text: str) -> str:
        try:
            parse(text)
        except ValueError as error:
            raise ArgumentTypeError(str(error)) from None
        return text
    return read


def zoo_model(text: str) -> str:
    """A model the capture can build: a zoo name, an hf: spec or MODULE:FACTORY."""
    from edge_remat_agent.zoo import not_a_model  # imports torch: only where it is asked for
    why = not_a_model(text)
    if why is not None:
        raise ArgumentTypeError(f"{text!r} is {why}")
    return text


# -- comma-separated lists -------------------------------------------------------------------

def comma_list(item: Callable[[str], T], allow_empty: bool = False) -> Callable[[str], list[T]]:
    """Comma-separated values, each read by `item`; blank ones are skipped ("1,2," is 1 and
    2). No value at all is refused unless `allow_empty` (a default of "" meaning none)."""
    def read(text: str) -> list[T]:
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
        if not values and not allow_empty:
            raise ArgumentTypeError(f"expected at least one comma-separated value, got {text!r}")
        return values
    return read


positive_floats = comma_list(positive_float)
positive_ints = comma_list(positive_int)


def names_among(known: Iterable[str], what: str = "name") -> Callable[[str], list[str]]:
    """Comma-separated names, each one of `known` (what the script can run); the error lists
    them, so that a typo is refused rather than run as nothing at all."""
    known = list(known)

    def name(text: str) -> str:
        if text not in known:
            raise ArgumentTypeError(f"unknown {what} {text!r} (known: {', '.join(known)})")
        return text
    return comma_list(name)


def none_or(read: Callable[[str], list[T]]) -> Callable[[str], list[T]]:
    """`read`, or no values for the word "none" (`--models none`: that part of the run off)."""
    def either(text: str) -> list[T]:
        return [] if text.strip().lower() == "none" else read(text)
    return either
