"""An `hf:` model spec read as text, without torch or transformers (the host reads it to find
the files it names, before anything is captured):

    hf:MODEL[?config=FILE][&adapter=FILE|DIR][&task=TASK]

hf.py builds the model from it."""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any

from ..user_code import module_file_spec, on_this_board, spec_file, with_absolute_file
from .errors import CaptureError

PREFIX = "hf:"
OPTIONS = ("config", "adapter", "task")
PATH_OPTIONS = ("config", "adapter")  # a file or folder, unless given as inline JSON
_READABLE = "/:,{}[]\" "  # left as they are in a canonical spec: paths and inline JSON


def is_hf_spec(spec: str) -> bool:
    return spec.startswith(PREFIX)


def is_path(model: str) -> bool:
    return os.sep in model or "/" in model or model.startswith(".") or os.path.isdir(model)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`hf:MODEL?k=v&...` -> (MODEL, options); unknown options are an error."""
    body = spec[len(PREFIX):]
    model, _, query = body.partition("?")
    options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False)) \
        if query else {}
    unknown = sorted(set(options) - set(OPTIONS))
    if not model:
        raise CaptureError(spec, "name the model after hf: (a model type such as gpt2, or a "
                           "local checkpoint directory)")
    if unknown:
        raise CaptureError(spec, f"unknown option {', '.join(unknown)}; an hf: spec takes "
                           + ", ".join(OPTIONS))
    return model, options


def path_options(options: dict[str, str]) -> dict[str, str]:
    """The options that name a file or folder (config, adapter), not inline JSON."""
    return {key: options[key] for key in PATH_OPTIONS
            if key in options and not options[key].lstrip().startswith("{")}


def json_option(spec: str, options: dict[str, str], key: str) -> dict[str, Any]:
    """The fields an option gives (config, adapter): inline JSON, a JSON file, or a folder's
    adapter_config.json; {} where the option is not given."""
    value = options.get(key)
    if value is None:
        return {}
    text = value
    if not value.lstrip().startswith("{"):
        value = on_this_board(value)
        path = os.path.join(value, "adapter_config.json") if os.path.isdir(value) else value
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise CaptureError(spec, f"cannot read the {key} file {path}: "
                               f"{exc.strerror or exc}") from None
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptureError(spec, f"the {key} is not valid JSON ({exc.msg} at line {exc.lineno})"
                           ) from None
    if not isinstance(loaded, dict):
        raise CaptureError(spec, f"the {key} must be a JSON object of fields")
    return loaded


def check_spec(spec: str) -> None:
    """What the capture reads of an hf: spec before transformers does, checked here, without
    torch (CaptureError in the capture's words): the spec parses, a checkpoint folder has its
    config.json, the config and the adapter (inline, a file, a folder) read as JSON objects.
    For a host that checks a spec it captures later (a fleet manifest: QA, `config=nope.json`
    was a failed task, not a manifest error). Whether transformers takes the fields is the
    capture's to say."""
    model, options = parse_spec(spec)
    if is_path(model) and not os.path.isfile(os.path.join(model, "config.json")):
        raise CaptureError(spec, f"{model} is not a checkpoint directory (no config.json in it)")
    for key in PATH_OPTIONS:
        json_option(spec, options, key)


def canonical_spec(spec: str) -> str:
    """The spec with local paths made absolute (the board rebuilds from it elsewhere): an hf:
    spec's checkpoint, config and adapter, a MODULE:FACTORY's file, a module of the current
    folder as its file (QA: a graph of `mymod:make` deployed to a local board failed there,
    "cannot import mymod", its agent working in another folder)."""
    if not is_hf_spec(spec):
        return with_absolute_file(module_file_spec(spec))
    model, options = parse_spec(spec)
    if is_path(model):
        model = os.path.abspath(model)
    options.update({key: os.path.abspath(value)
                    for key, value in path_options(options).items()})
    query = "&".join(f"{k}={urllib.parse.quote(options[k], safe=_READABLE)}"
                     for k in OPTIONS if k in options)
    return PREFIX + model + (f"?{query}" if query else "")


def files_named(spec: str) -> list[str]:
    """The files (not folders) on this machine that a model or data spec names: a
    MODULE:NAME's Python file, an hf: spec's config and adapter files; absolute paths as a
    canonical spec writes them. A spec that does not parse names none here: whoever reads
    it refuses it."""
    if is_hf_spec(spec):
        try:
            _, options = parse_spec(spec)
        except CaptureError:
            return []
        named = list(path_options(options).values())
    else:
        named = [spec_file(spec) or ""]
    return [path for path in named if os.path.isabs(path) and os.path.isfile(path)]
