"""The fleet manifest (TOML): which models, which boards, which budgets and deadlines.

    budgets = ["30%", "50%", "512MiB"]     # required: fractions of the plain peak, or sizes
    deadlines = [1.3]                      # optional: multiples of the plain time (one task each)
    threads = 1                            # optional: solver threads per task (default: the
                                           #   cores shared out among the tasks in flight)
    out = "fleet-plans"                    # optional: the output tree (--out wins)
    [plan]                                 # optional: the `plan` command's options, every task
    objective = "time"                     # time | energy
    solver = "auto"                        # auto | cpsat | milp | heuristic:NAME
    time_limit = 60                        # seconds per solve
    paging = "flash"                       # none | flash | host | both (default: as plan)
    paging_time = "counted"                # counted | free
    backend = "cbc"                        # cbc | highs
    [[models]]
    model = "resnet18"                     # zoo name, MODULE:FACTORY or hf:..., or instead
    # graph = "resnet18.json"              #   a graph file already captured
    name = "resnet18-b16"                  # optional: its folder in the output tree
    batch = 16                             # optional, as `edge-remat graph`: batch, image, seq,
                                           #   seed, optimizer, max_nodes, level, params_home,
                                           #   update, train, clip_grad_norm, accumulate,
                                           #   dtype, trainable_dtype, operator_level (true:
                                           #   one node per ATen op; not with max_nodes or
                                           #   level)
    [[boards]]
    profile = "profiles/rpi4.json"         # a profile file, or
    # device = "jetson-orin-nano"          #   a device config: its shipped (modelled) profile
    name = "rpi4"                          # optional: its folder in the output tree

Paths are relative to the manifest's folder. Every mistake is reported, each on its own
`error:` line, before any work starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from edge_remat_agent.capture import DEFAULT_LR, DTYPE_NAMES, mixed_dtype_problem
from edge_remat_agent.formats import FormatError, Graph, Profile, load_profile
from edge_remat_agent.formats.graph_details import PARAM_HOMES, UPDATE_MODES
from edge_remat_agent.user_code import names_file, source_digest, spec_file

from ..errors import UserError
from ..tomlfile import read_toml
from ..units import UnitError, parse_budget, parse_multiplier

TOP_KEYS = {"budgets", "deadlines", "threads", "out", "plan", "models", "boards"}
PLAN_KEYS = {"objective", "solver", "time_limit", "paging", "paging_time", "backend"}
CAPTURE_KEYS = {"batch", "image", "seq", "seed", "optimizer", "max_nodes", "level",
                "params_home", "update", "train", "clip_grad_norm", "accumulate",
                "operator_level", "dtype", "trainable_dtype"}
MODEL_KEYS = {"model", "graph", "name"} | CAPTURE_KEYS
BOARD_KEYS = {"profile", "device", "name"}


class ManifestError(UserError):
    """Every mistake in a manifest, one `error:` line each (the CLI adds the first `error: `)."""

    def __init__(self, mistakes: list[str]):
        self.mistakes = mistakes
        super().__init__("\nerror: ".join(mistakes))


@dataclass(frozen=True)
class PlanSettings:
    objective: str = "time"
    solver: str = "auto"
    time_limit: float = 60.0
    paging: Optional[str] = None
    paging_time: str = "counted"
    backend: str = "cbc"


@dataclass
class ModelEntry:
    name: str
    spec: Optional[str]  # what capture_model builds; None when a graph file is given
    capture: dict[str, Any]  # capture_model's keyword arguments
    graph_file: Optional[Path] = None
    graph: Optional[Graph] = field(default=None, repr=False)  # the graph file's, read

    def capture_args(self) -> dict[str, Any]:
        """What the capture depends on: a graph captured with the same is reused. The model's
        source file by its digest (QA: after the factory's file changed, a run again kept
        the graph and plans of the model as it was)."""
        digest = source_digest(self.spec) if self.spec else None
        return {"model": self.spec, **self.capture,
                **({"source_sha256": digest} if digest else {})}


@dataclass
class BoardEntry:
    name: str
    profile: Profile
    profile_path: Path


@dataclass
class Manifest:
    path: Path
    models: list[ModelEntry]
    boards: list[BoardEntry]
    budgets: list[str]
    deadlines: list[Optional[float]]
    plan: PlanSettings
    threads: Optional[int] = None
    out: Optional[Path] = None


def load_manifest(path: "str | Path") -> Manifest:
    path = Path(path)
    data = read_toml(path, "fleet manifest")
    mistakes: list[str] = []
    here = path.parent

    def note(where: str, what: str) -> None:
        mistakes.append(f"{path}: {where}: {what}")

    def checked(where: str, parse: Callable[[], Any], default: Any = None) -> Any:
        try:
            return parse()
        except (FormatError, UnitError, UserError, ValueError) as exc:
            note(where, str(exc))
            return default

    for key in sorted(set(data) - TOP_KEYS):
        note(key, f"no such field (known: {', '.join(sorted(TOP_KEYS))})")
    budgets = _strings(data, "budgets", note, required=True)
    read: dict = {}  # budget -> the first index that gave it
    for i, text in enumerate(budgets):
        budget = checked(f"budgets[{i}]", lambda text=text: parse_budget(text))
        if budget is not None and budget in read:  # QA: "150%" and "1.5" planned twice
            first = read[budget]
            note(f"budgets[{i}]", f"{text!r} is budgets[{first}] ({budgets[first]!r}) again: "
                                  "list each budget once")
        elif budget is not None:
            read[budget] = i
    deadlines: list[Optional[float]] = [None]
    if "deadlines" in data:
        raw = data["deadlines"]
        if not isinstance(raw, list) or not raw:
            note("deadlines", "expected a list of multiples of the plain time, e.g. [1.3]")
        else:
            deadlines = [checked(f"deadlines[{i}]", lambda v=v: _deadline(v)) for i, v in
                         enumerate(raw)]
    threads = data.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        note("threads", f"expected a whole number of solver threads >= 1, got {threads!r}")
    out = data.get("out")
    if out is not None and not isinstance(out, str):
        note("out", f"expected a folder name, got {out!r}")
    settings = _plan_settings(data.get("plan", {}), note)
    models = [m for i, raw in enumerate(_tables(data, "models", note))
              if (m := _model(raw, f"models[{i}]", here, note)) is not None]
    boards = [b for i, raw in enumerate(_tables(data, "boards", note))
              if (b := _board(raw, f"boards[{i}]", here, note)) is not None]
    for kind, entries in (("models", models), ("boards", boards)):
        seen: set[str] = set()
        for name in [entry.name for entry in entries]:
            if name in seen:  # once however many share it (QA: three said it twice)
                continue
            if sum(entry.name == name for entry in entries) > 1:
                note(kind, f"two entries are named {name!r}: give each a distinct `name`")
            seen.add(name)
    if mistakes:
        raise ManifestError(mistakes)
    return Manifest(path, models, boards, budgets, deadlines, settings, threads,
                    here / out if out else None)


def _strings(data: dict, key: str, note, required: bool = False) -> list[str]:
    raw = data.get(key)
    if raw is None:
        if required:
            note(key, "missing: list the budgets to plan, e.g. budgets = [\"30%\", \"512MiB\"]")
        return []
    if not isinstance(raw, list) or not raw or not all(isinstance(v, (str, int, float))
                                                        and not isinstance(v, bool) for v in raw):
        note(key, f"expected a non-empty list such as [\"30%\", 0.5, \"512MiB\"], got {raw!r}")
        return []
    return [str(v) for v in raw]


def _deadline(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a multiple of the plain time such as 1.3, got {value!r}")
    return parse_multiplier(str(value))


def _tables(data: dict, key: str, note) -> list[dict]:
    raw = data.get(key)
    example = "[[models]] with model = \"resnet18\"" if key == "models" else \
        "[[boards]] with profile = \"profiles/rpi4.json\""
    if raw is None:
        note(key, f"missing: add at least one {example}")
        return []
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw) or not raw:
        note(key, f"expected tables written as {example}")
        return []
    return raw


def _plan_settings(raw: Any, note) -> PlanSettings:
    from ..checks import solver_option_mistakes
    from ..planner.build import PAGING_CHOICES

    if not isinstance(raw, dict):
        note("plan", "expected a table [plan]")
        return PlanSettings()
    for key in sorted(set(raw) - PLAN_KEYS):
        note(f"plan.{key}", f"no such field (known: {', '.join(sorted(PLAN_KEYS))})")
    choices = {"objective": ("time", "energy"), "paging": tuple(PAGING_CHOICES),
               "paging_time": ("counted", "free")}
    values = {}
    for key, allowed in choices.items():
        if key in raw:
            if raw[key] not in allowed:
                note(f"plan.{key}", f"expected one of {', '.join(allowed)}, got {raw[key]!r}")
            else:
                values[key] = raw[key]
    settings = PlanSettings(**values)
    solver, time_limit, backend = (raw.get("solver", settings.solver),
                                   raw.get("time_limit", settings.time_limit),
                                   raw.get("backend", settings.backend))
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)):
        note("plan.time_limit", f"expected seconds, got {time_limit!r}")
        return settings
    mistakes = solver_option_mistakes(str(solver), float(time_limit), None, str(backend))
    for mistake in mistakes:
        note("plan", mistake.replace("--time-limit", "time_limit").replace("--", ""))
    if mistakes:
        return settings
    return PlanSettings(settings.objective, str(solver), float(time_limit), settings.paging,
                        settings.paging_time, str(backend))


def _model(raw: dict, where: str, here: Path, note) -> Optional[ModelEntry]:
    for key in sorted(set(raw) - MODEL_KEYS):
        note(f"{where}.{key}", f"no such field (known: {', '.join(sorted(MODEL_KEYS))})")
    spec, graph_file = raw.get("model"), raw.get("graph")
    if (spec is None) == (graph_file is None):
        note(where, "give exactly one of `model` (zoo name, MODULE:FACTORY, hf:...) and "
                    "`graph` (a captured graph file)")
        return None
    if not isinstance(spec if spec is not None else graph_file, str):
        note(where, "`model` and `graph` are strings")
        return None
    capture: dict[str, Any] = {}
    for key in ("batch", "image", "seq", "max_nodes", "level", "accumulate"):
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                note(f"{where}.{key}", f"expected a whole number >= 1, got {value!r}")
            else:
                capture[key] = value
    if "seed" in raw:
        if isinstance(raw["seed"], bool) or not isinstance(raw["seed"], int):
            note(f"{where}.seed", f"expected a whole number, got {raw['seed']!r}")
        else:
            capture["seed"] = raw["seed"]
    for key, allowed in (("optimizer", tuple(DEFAULT_LR)), ("params_home", PARAM_HOMES),
                         ("update", UPDATE_MODES), ("dtype", DTYPE_NAMES),
                         ("trainable_dtype", DTYPE_NAMES)):
        if key in raw:
            if raw[key] not in allowed:
                note(f"{where}.{key}", f"expected one of {', '.join(allowed)}, got {raw[key]!r}")
            else:
                capture[key] = raw[key]
    if (mixed := mixed_dtype_problem(capture.get("dtype"), capture.get("trainable_dtype"))):
        note(f"{where}.trainable_dtype", mixed.replace("--trainable-dtype", "trainable_dtype")
             .replace("--dtype", "dtype"))
    if "clip_grad_norm" in raw:
        from edge_remat_agent.grad_clip import check_max_norm
        value = raw["clip_grad_norm"]
        try:
            if isinstance(value, bool):
                raise ValueError(f"expected a positive number such as 1.0, got {value!r}")
            capture["clip_grad_norm"] = check_max_norm(value)
        except ValueError as error:
            note(f"{where}.clip_grad_norm", str(error).replace("--clip-grad-norm ", ""))
    if "train" in raw:
        train = raw["train"]
        if not isinstance(train, list) or not all(isinstance(t, str) for t in train):
            note(f"{where}.train", f"expected a list of name patterns such as [\"fc.*\"], "
                                   f"got {train!r}")
        else:
            capture["train"] = train
    if "operator_level" in raw:
        if not isinstance(raw["operator_level"], bool):
            note(f"{where}.operator_level", f"expected true or false, got "
                                            f"{raw['operator_level']!r}")
        elif raw["operator_level"]:
            capture["operator_level"] = True
    from ..granularity import as_manifest_keys, granularity_mistake
    mistake = granularity_mistake(capture.get("operator_level", False),
                                  capture.get("max_nodes"), capture.get("level"))
    if mistake is not None:
        note(where, as_manifest_keys(mistake))
    if graph_file is not None:
        if capture:
            note(where, f"{', '.join(sorted(capture))}: capture settings need `model`, not a "
                        "`graph` file")
        file = here / graph_file
        if not file.is_file():
            note(f"{where}.graph", f"no such file {file}")
            return None
        graph = _graph_file(file, f"{where}.graph", note)
        if graph is None:
            return None
        return ModelEntry(_name(raw, file.stem, where, note), None, {}, file, graph)
    if ":" not in spec:  # a zoo name: checked now, not after the other tasks have run
        from edge_remat_agent.zoo import MODELS
        if spec not in MODELS:
            note(f"{where}.model", f"no zoo model {spec!r}: give one of "
                                   f"{', '.join(sorted(MODELS))}, MODULE:FACTORY or hf:...")
            return None
    try:
        spec = _local_spec(spec, here)
        if spec.startswith("hf:"):  # its files (a config, an adapter, a checkpoint) now too
            from edge_remat_agent.capture.hf_spec import check_spec
            check_spec(spec)  # QA: `config=nope.json` was a failed capture, exit 1
    except ValueError as exc:  # CaptureError: the spec in the capture's own words
        note(f"{where}.model", str(exc))
        return None
    file = spec_file(spec)  # MODULE:FACTORY with a file: checked now, as a zoo name is
    if file is not None and not Path(file).is_file():
        note(f"{where}.model", f"no such file {file} (paths are relative to the manifest)")
        return None
    return ModelEntry(_name(raw, spec, where, note), spec, capture)


def _graph_file(file: Path, where: str, note) -> Optional[Graph]:
    """The graph in a manifest's `graph` file, read now, with every other mistake (QA: a plan
    file given there was refused naming the file alone, 'p.json: field 'format': ...', not
    the manifest's field, as every other mistake is)."""
    from ..errors import classify
    from ..importers.graph_import import load_graph_file
    try:
        return load_graph_file(file)
    except (FormatError, UnitError, UserError, ValueError, OSError, OverflowError,
            MemoryError) as exc:
        note(where, classify(exc)[1])
        return None


def _local_spec(spec: str, here: Path) -> str:
    """Paths in a spec (MODULE:FACTORY with a file, hf: checkpoints, configs, adapters) are
    relative to the manifest's folder; made absolute here, as the tasks run elsewhere."""
    if spec.startswith("hf:"):
        import os
        from edge_remat_agent.capture.hf_spec import canonical_spec
        cwd = os.getcwd()
        os.chdir(here)  # canonical_spec resolves against the working folder
        try:
            return canonical_spec(spec)
        finally:
            os.chdir(cwd)
    if ":" not in spec:
        return spec
    module, factory = spec.rsplit(":", 1)
    if names_file(module):
        module = str((here / module).resolve())
    return f"{module}:{factory}"


def _name(raw: dict, default: str, where: str, note) -> str:
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        note(f"{where}.name", f"expected a non-empty string, got {name!r}")
        name = None
    elif name is not None and slug(name) != name:  # QA: '../x' became 'x' without a word
        note(f"{where}.name", "expected letters, digits, '.', '_' and '-' only (it names the "
             f"entry's folder of results), got {name!r}")
        return name  # refused: kept as written, so that no other entry seems to share it
    return slug(name or _short_default(default))


def _short_default(spec: str) -> str:
    """A folder name from a model spec: `examples/my_model.py:make_model` -> my_model."""
    if ":" in spec and not spec.startswith("hf:"):
        spec = Path(spec.rsplit(":", 1)[0]).stem
    return spec.split("?", 1)[0]


def slug(text: str) -> str:
    """A name safe as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "x"


def _board(raw: dict, where: str, here: Path, note) -> Optional[BoardEntry]:
    for key in sorted(set(raw) - BOARD_KEYS):
        note(f"{where}.{key}", f"no such field (known: {', '.join(sorted(BOARD_KEYS))})")
    profile, device = raw.get("profile"), raw.get("device")
    if (profile is None) == (device is None):
        note(where, "give exactly one of `profile` (a profile JSON) and `device` (a device "
                    "config whose shipped profile plans for it)")
        return None
    if isinstance(profile, str) and not profile.strip():  # here / '' is the manifest's folder
        note(f"{where}.profile", "is empty: give a profile JSON, or `device` instead")
        return None
    if device is not None:
        path = _device_profile(str(device), where, note)
        if path is None:
            return None
        default = str(device)
    else:
        path = here / str(profile)
        default = path.stem
    try:
        loaded = load_profile(path)
    except (FormatError, OSError, ValueError) as exc:
        note(f"{where}.profile", f"cannot load {path}: {getattr(exc, 'strerror', None) or exc}")
        return None
    return BoardEntry(_name(raw, default, where, note), loaded, path)


def _device_profile(device: str, where: str, note) -> Optional[Path]:
    from ..devices import DeviceError, device_argument, find_device
    from ..run.profiles import modelled_profile_for
    try:
        config = find_device(device)
    except (DeviceError, FormatError) as exc:
        note(f"{where}.device", str(exc))
        return None
    path = modelled_profile_for(config)
    if path is None:
        command = f"edge-remat profile --device {device_argument(config)}"
        note(f"{where}.device", f"{config.name} has no shipped profile: measure one with "
                                f"`{command}` and give it as `profile`")
    return path
