"""Measuring a board's profile: the one entry point that the `profile` and `profile-storage`
commands and the daemon's "profile" job all call (as run_plan is for training).

measure_profile(options, progress) times every graph node (ops.py) when options.graph is
given, and measure_board(options) the rest: flash (with page_dir), the link to the host's page
service (with host_pages), idle and busy power, the runtime's footprint and the identity.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..formats import Profile
from ..units import format_size, parse_size
from .contention import MAX_S as SHARE_MAX_S

SIZE_OPTIONS = {"min_size", "max_size", "flash_capacity"}
NUMBER_OPTIONS = {"window_s", "idle_s", "busy_s", "op_window_s", "share_s"}
FLAG_OPTIONS = {"no_fsync", "no_footprint"}
MAX_WINDOW_S = 3600.0  # an hour for any one measurement: more is a mistake, not a profile


@dataclass(frozen=True)
class ProfileOptions:
    """What to measure; the fields are the `edge-remat-agent profile` options' long names."""

    graph: str | None = None  # graph JSON whose nodes to time (None: no op costs)
    page_dir: str | None = None  # directory on the flash to measure (None: no flash tier)
    sizes: tuple[int, ...] | None = None  # page sizes (None: min_size..max_size, x4 steps)
    min_size: int = 4 * 2**10
    max_size: int = 64 * 2**20
    window_s: float = 0.01  # repeat each page size until this much time is measured
    share_s: float = SHARE_MAX_S  # at most this long on each tier's compute share (0: not
    # measured)
    no_fsync: bool = False
    flash_capacity: int | None = None  # None: the free space under page_dir
    sensor: str = "auto"  # a sensor name, "auto" (else the labelled model estimate) or "none"
    idle_s: float = 2.0
    busy_s: float = 2.0
    model: str | None = None  # for the runtime footprint: a zoo name or module:function
    # the footprint model's --dtype and --trainable-dtype (None: fp32, or a graph's own)
    dtype: str | None = None
    trainable_dtype: str | None = None
    no_footprint: bool = False
    name: str | None = None  # the profile's name (default: the board's model)
    host_pages: str | None = None  # HOST:PORT of the host's page service: the `host` tier
    op_window_s: float = 0.01  # time each node until this much is measured
    device: str = "cpu"  # torch device for the op timings

    def __post_init__(self) -> None:
        """Options no measurement can use are refused here, before any is made (ValueError)."""
        if self.page_dir is not None and not str(self.page_dir).strip():
            raise ValueError("--page-dir is empty: name a directory on the flash")
        for name, least in (("window_s", None), ("op_window_s", None), ("share_s", 0.0),
                            ("idle_s", 0.0), ("busy_s", 0.0)):
            value = getattr(self, name)
            # nan fails both; inf (QA: `--param busy_s=inf` measured until killed) the bound
            if not (value > 0 if least is None else value >= least) or value > MAX_WINDOW_S:
                wanted = "a positive number" if least is None else "0 or more"
                raise ValueError(f"--{name.replace('_', '-')} must be {wanted} of seconds, "
                                 f"at most {MAX_WINDOW_S:g}, not {value}")
        # a line, latency + bytes / bandwidth, needs two sizes (QA: one 4 KiB size fitted
        # latency 0 and a bandwidth 100x too low, in silence)
        if self.sizes is None and not 0 < self.min_size < self.max_size:
            raise ValueError(f"--min-size ({format_size(self.min_size)}) must be more than 0 "
                             f"and less than --max-size ({format_size(self.max_size)}): the "
                             f"latency and bandwidth fitted need two sizes at least")
        if self.sizes is not None and len(set(self.sizes)) < 2:
            raise ValueError(f"--sizes gives {len(set(self.sizes))} size: the latency and "
                             f"bandwidth fitted need two at least (e.g. 4KiB,64MiB)")
        self._check_dtypes()

    def _check_dtypes(self) -> None:
        """--dtype and --trainable-dtype as `graph` and `run` check them, and only where a
        model is built with them (the footprint's --model, or the graph's)."""
        from ..capture import DTYPE_NAMES, mixed_dtype_problem
        for name in ("dtype", "trainable_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPE_NAMES:
                raise ValueError(f"unknown --{name.replace('_', '-')} {value!r}: use one of "
                                 f"{', '.join(DTYPE_NAMES)}")
        if (problem := mixed_dtype_problem(self.dtype, self.trainable_dtype)) is not None:
            raise ValueError(problem)
        if (self.dtype or self.trainable_dtype) and not (self.model or self.graph):
            raise ValueError("--dtype and --trainable-dtype say how the footprint's model is "
                             "built, and no model is: give --model (or --graph), or leave "
                             "them out")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "ProfileOptions":
        """A job's params (JSON values: sizes as numbers or "64MiB", sizes also as a list or
        "4KiB,1MiB") as options; ValueError names a bad one."""
        known = [f.name for f in dataclasses.fields(cls)]
        values: dict[str, Any] = {}
        for key, value in params.items():
            if key not in known:
                raise ValueError(f"unknown profile param {key!r}: the params are the options of "
                                 f"`edge-remat-agent profile` by their long names "
                                 f"({', '.join(known)})")
            if value is not None:
                values[key] = _param(key, value)
        return cls(**values)


def _param(key: str, value: Any) -> Any:
    def bad(expected: str) -> ValueError:
        return ValueError(f"bad profile param {key}={value!r}: expected {expected}")
    if key in FLAG_OPTIONS:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if isinstance(value, bool) or isinstance(value, dict):
        raise bad("a number, a size or a text")
    try:
        if key in NUMBER_OPTIONS:
            return float(value)
        if key in SIZE_OPTIONS:
            return parse_size(str(value))
        if key == "sizes":
            parts = value.split(",") if isinstance(value, str) else list(value)
            return tuple(sorted({parse_size(str(part)) for part in parts if str(part).strip()}))
    except (ValueError, TypeError):
        raise bad("a number of seconds" if key in NUMBER_OPTIONS else
                  "a size such as 64MiB" if key in SIZE_OPTIONS else
                  "sizes such as \"4KiB,1MiB\" or [4096, 1048576]") from None
    return str(value)


def to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_profile(options: ProfileOptions, progress=None, say: Callable[[str], None] = to_stderr
                    ) -> Profile:
    """The measured profile (not yet written). progress(index, total, node measurement); say
    (a line) as each phase starts: on a slow board (the emulated arm64 board: capture 6 min,
    the footprint's fresh torch import 1-2 min) each takes minutes."""
    check_power_sensor(options)
    if options.model and not options.no_footprint:
        model_builder(options.model)  # one the board cannot build: said before the capture
    from ..devices import unavailable
    if (why := unavailable(options.device)) is not None:
        raise ValueError(why)
    graph = captured = None
    if options.graph:
        from ..executor.run import capture_here
        from ..formats import load_graph
        from ..executor.updates import homed_parameters
        graph = load_graph(options.graph)
        refuse_other_dtypes(options, graph.capture.get("source") or {}, options.graph)
        # timing runs plain steps, every parameter in RAM: a graph that homes them on flash
        # is timed through its twin in RAM, whose compute nodes are its own
        in_ram = bool(homed_parameters(graph))
        say(f"capture: tracing '{graph.name}' here ({graph.capture.get('captured_nodes', '?')} "
            "ATen ops) to run its nodes" + (", with its parameters in RAM (their loads are "
                                            "costed from their home's figures)"
                                            if in_ram else ""))
        captured = capture_here(graph, in_ram=in_ram)
        graph = captured.graph
        model = str(graph.capture.get("source", {}).get("model", ":"))
        if not options.model and ":" not in model:
            options = dataclasses.replace(options, model=model)  # the footprint with this model
    first_step = None
    if captured is not None:  # first, as in a run's job: the board's measurements below warm
        # up part of what its first step pays (gpt-tiny: 1.29 MiB left after them, 2.43
        # MiB in a job that had only captured the graph)
        from .ops import first_step_left
        say("memory: one plain step, what its first calls leave")
        first_step = first_step_left(captured, options.device)
    profile = measure_board(options, say, graph.capture.get("source") if graph else None)
    if captured is None:
        return profile
    from ..sensors import open_sensor
    from .ops import measure_nodes, ops_from, window_s
    sensor_name = profile.device.get("sensor")
    sensor = None if not sensor_name or profile.device.get("power_estimate") \
        else open_sensor(sensor_name)
    say(f"ops: {len(graph)} nodes of '{graph.name}', each timed for at least "
        f"{window_s(options.op_window_s, sensor):g} s")
    nodes = measure_nodes(captured, options.op_window_s, sensor,
                          profile.idle_w if sensor is not None else None, options.device,
                          progress, first_step=first_step)
    profile.ops = ops_from(nodes)
    profile.measurements["ops"] = {
        "graph": graph.name, "graph_fingerprint": graph.fingerprint(),
        "method": "time_s: each planner node's median over plain steps run node by node "
                  "(StepRunner, the executor's engine); isolated_time_s: the node re-run on "
                  "real inputs until the window is measured (best of 3 windows); energy from "
                  "the isolated windows; bytes from the real tensors",
        "context_steps": nodes[0].context_runs if nodes else 0,
        "window_s": window_s(options.op_window_s, sensor), "device": options.device,
        "energy": "above idle, from sensor " + sensor_name if sensor is not None else
                  "not measured (no sensor): the planner uses time x (active - idle) power",
        "nodes": [m.to_dict() for m in nodes]}
    return profile


def measure_board(options: ProfileOptions, say: Callable[[str], None] = to_stderr,
                  source: dict | None = None) -> Profile:
    """Flash (with page_dir), the host link (with host_pages), power, runtime footprint and
    identity, as a measured profile without op costs. Raises what `board_errors()` names;
    callers check the sensor first (check_power_sensor), before any other work of theirs.
    `source`: the profiled graph's `capture.source`, which the footprint's model is built as."""
    from . import (board_identity, measure_flash, measure_power, measure_runtime_footprint,
                   measured_profile, sizes_between)
    footprint = built_as = build = None
    if not options.no_footprint and options.model:  # built first: a bad one fails at once
        built_as = footprint_source(options, source)
        build = model_builder(options.model, built_as)
    sizes = options.sizes or sizes_between(options.min_size, options.max_size)
    flash = None
    if options.page_dir:
        say(f"flash: {len(sizes)} sizes, {format_size(sizes[0])} .. {format_size(sizes[-1])} "
            f"in {options.page_dir}")
        flash = measure_flash(options.page_dir, sizes, options.window_s,
                              fsync=not options.no_fsync, capacity_bytes=options.flash_capacity,
                              share_s=options.share_s)
    host, not_measured = host_tier(options, sizes, say)
    say(f"power: sensor {options.sensor}, {options.idle_s} s idle, {options.busy_s} s busy")
    power = measure_power(options.sensor, idle_s=options.idle_s, busy_s=options.busy_s)
    if not options.no_footprint:
        say("footprint: a fresh Python's memory, bare, after import torch"
            + (f" and after building {options.model}" if options.model else ""))
        footprint = measure_runtime_footprint(build)
    profile = measured_profile(board_identity(sensor=power.sensor), power, flash=flash,
                               host=host, footprint=footprint, name=options.name,
                               not_measured=not_measured)
    if built_as:  # which model, in which dtypes, the footprint's parameter bytes are
        profile.measurements["runtime_footprint"]["model"] = {
            key: built_as[key] for key in ("model", "dtype", "trainable_dtype")
            if key in built_as}
    from .compute import measure_compute_rates
    say("compute: the board's matmul, copy and one-op rates, for nodes not timed here")
    profile.compute, method = measure_compute_rates()
    profile.measurements["compute"] = {"method": method}
    return profile


def footprint_source(options: ProfileOptions, graph_source: dict | None) -> dict:
    """The `capture.source` the footprint's model (options.model) is built as: the profiled
    graph's where it names that model (its shapes, frozen parameters and dtypes); else the
    model alone, in the graph's dtypes or, without a graph, the options' (--dtype,
    --trainable-dtype): the runtime's memory with the parameters the run will hold."""
    if graph_source and graph_source.get("model") == options.model:
        return dict(graph_source)
    if graph_source is not None:
        dtypes = {k: graph_source[k] for k in ("dtype", "trainable_dtype") if k in graph_source}
    else:
        from ..capture.precision import dtype_source
        dtypes = dtype_source(options.dtype, options.trainable_dtype)
    return {"model": options.model, **dtypes}


def refuse_other_dtypes(options: ProfileOptions, source: dict, path) -> None:
    """A graph's nodes are timed in the dtypes it was captured in (its capture.source):
    --dtype or --trainable-dtype naming others would measure another run than the graph's."""
    if options.dtype is None and options.trainable_dtype is None:
        return
    from ..capture.precision import dtype_source
    given = dtype_source(options.dtype, options.trainable_dtype)
    recorded = dtype_source(source.get("dtype"), source.get("trainable_dtype"))
    if given != recorded:
        said = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in recorded.items()) or \
            "--dtype fp32"
        raise ValueError(f"{path} was captured with {said}, and its nodes are timed in those "
                         "dtypes: leave --dtype and --trainable-dtype out (the graph's are "
                         "used), or capture the graph with the ones you give")


def check_power_sensor(options: ProfileOptions) -> None:
    """A measured profile needs power figures: a sensor that will not open (`--sensor none`, a
    name the board lacks) is said before the capture and the flash's minutes, not after them."""
    from .power import choose_sensor
    from .profile_writer import no_power_figures
    sensor, reasons = choose_sensor(options.sensor)  # SensorError: a name that does not open
    if sensor is None:
        raise no_power_figures(reasons)


# How long the host-link measurement waits for a lost page service: a few seconds, not a run's
# whole reconnect window (pages/service.py WAIT_S, 150 s): a profile that waited that long and
# then failed lost every measurement before it (QA: sshd killed during "host link").
LINK_WAIT_S = 5.0
LINK_TRIES = 2  # a link that broke and came back is measured again: its times held the wait


class HostLinkLost(Exception):
    """The host page service was lost during the host-link measurement: no `host` tier."""


def host_tier(options: ProfileOptions, sizes, say: Callable[[str], None]):
    """(the host-link measurement or None, the tiers not measured and why, or None). A lost
    link leaves the host tier out and the profile goes on with its other measurements."""
    if not options.host_pages:
        return None, None
    try:
        return measure_host_link(options.host_pages, sizes, options.window_s, options.share_s,
                                 say), None
    except HostLinkLost as lost:
        say(f"host link: not measured ({lost}); the profile goes on without the host tier "
            "(profile again over a steady link to measure it)")
        return None, {"host": str(lost)}


def measure_host_link(address: str, sizes, window_s: float, share_s: float = SHARE_MAX_S,
                      say: Callable[[str], None] = to_stderr,
                      wait_s: float = LINK_WAIT_S):
    """The `host` tier: tensors paged to the host's page service and back through the store a
    run uses (encoding and CRC32 included, as for the flash), over the agent's link. A page
    service lost for more than `wait_s` is HostLinkLost; one that came back is measured again
    (LINK_TRIES measurements in all)."""
    say(f"host link: {len(sizes)} sizes to the page service at {address}")
    for _ in range(LINK_TRIES):
        measurement = _link_measured_once(address, sizes, window_s, share_s, wait_s)
        if measurement is not None:
            return measurement
        say("host link: the link dropped during the measurement and came back; measuring again")
    raise HostLinkLost(f"the link to the host page service at {address} dropped during each of "
                       f"{LINK_TRIES} measurements, whose times would hold its waits")


def _link_measured_once(address: str, sizes, window_s: float, share_s: float, wait_s: float):
    """One measurement on a connection of its own; None where the link broke under it and came
    back. Its first request connects, so a link down at the start is waited for alike."""
    from ..pages.link import ServiceStore
    from ..pages.service import PageClient, PageServiceError
    from .tiers import measure_store
    client = PageClient(address, wait_s=wait_s)
    try:
        with ServiceStore(client) as store:
            measurement = measure_store(store, sizes, window_s,
                                        method=f"ServiceStore put/get to the host's page "
                                               f"service ({address})", share_s=share_s)
    except PageServiceError:
        if client.lost is None:
            raise  # the service answered, and refused: not a lost link
        raise HostLinkLost(f"lost the link to the host page service at {address}: out of "
                           f"reach for {wait_s:g} s ({client.lost})") from None
    return None if client.breaks else measurement


def model_builder(spec: str, source: dict | None = None) -> Callable[[], Any]:
    """'mlp' -> the zoo's mlp; 'package.module:function' -> that function (no arguments).
    A zoo model a graph was captured from (`source`, its `capture.source`) is built as the run
    builds it: in the graph's dtypes (--dtype, --trainable-dtype), shapes and frozen
    parameters, where the zoo's own default is float32; any model whose `source` names
    dtypes (footprint_source) is built in them, as load_model builds it."""
    if ":" not in spec:
        from .. import zoo
        if spec not in zoo.MODELS:
            raise ValueError(f"no zoo model {spec!r}: use one of {', '.join(zoo.MODELS)} "
                             "or module:function")
    from ..capture.models import load_source_model
    named = source is not None and source.get("model") == spec
    if named and (":" not in spec or "dtype" in source or "trainable_dtype" in source):
        return functools.partial(load_source_model, dict(source))
    if ":" not in spec:
        return functools.partial(zoo.build, spec)
    # hf: specs and MODULE:FACTORY (a module or a .py file) are built as a capture builds
    # them; the module is imported here, so that one the board lacks is said before the
    # measurements' seconds, not after them as a bare ModuleNotFoundError (QA)
    from ..capture.hf_spec import is_hf_spec
    if not is_hf_spec(spec):
        from ..user_code import UserCodeError, import_user_module
        module_part, _, factory_name = spec.rpartition(":")
        here = "on the board, which builds --model to measure the runtime's memory with it"
        try:
            module = import_user_module(module_part, "edge_remat_user_")
        except UserCodeError as exc:
            raise ValueError(f"--model {spec}: {exc}, {here}") from None
        if not callable(getattr(module, factory_name, None)):
            raise ValueError(f"--model {spec}: {module_part} has no callable named "
                             f"{factory_name!r}, {here}")
    return functools.partial(load_source_model, dict(source) if named else {"model": spec})


def board_errors() -> tuple[type[BaseException], ...]:
    """What measuring the board can raise that is the board's or the options' fault."""
    from ..pages import PageStoreError
    from ..sensors import SensorError
    from .profile_writer import ProfileIncomplete
    return (PageStoreError, SensorError, ProfileIncomplete, ValueError, RuntimeError, OSError)


def profile_summary(profile: Profile, output: str) -> dict[str, Any]:
    """What the `profile` command prints and the job returns."""
    ops = profile.measurements.get("ops", {})
    return {"output": output, "source": profile.source, "name": profile.name,
            "ops": len(profile.ops), "nodes": len(ops.get("nodes", [])),
            "graph": ops.get("graph"), "tiers": sorted(profile.tiers),
            "idle_w": profile.idle_w, "active_w": profile.active_w,
            "sensor": profile.device.get("sensor"),
            "power_estimate": profile.device.get("power_estimate"),
            "runtime_baseline_bytes": profile.runtime_baseline_bytes,
            **_not_measured(profile), **_share_fallback(profile)}


def _share_fallback(profile: Profile) -> dict[str, Any]:
    """Tiers whose compute_share is the fallback, not the one measured beside compute, and
    why (contention.py), where there are any: host's `profile` prints it as a row."""
    from ..formats.profile import share_notes
    notes = share_notes(profile.measurements)
    return {"compute_share": "; ".join(notes)} if notes else {}


def _not_measured(profile: Profile) -> dict[str, Any]:
    """The tiers asked for and not measured, and why (a lost host link), where there are any."""
    not_measured = profile.measurements.get("tiers_not_measured")
    return {"tiers_not_measured": not_measured} if not_measured else {}
