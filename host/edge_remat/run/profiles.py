"""Which device profile a run plans with: given, cached, measured now, or modelled.

In that order: `--profile FILE`; a profile this host measured earlier on the same board for the
same model (cached under ~/.cache/edge-remat/profiles, keyed by the board's identity, its page
folder and the model); a fresh measurement by the board's agent (its "profile" job: every graph
node, the flash in the page folder the run pages to, power, the runtime's memory); and where
the agent cannot measure, the modelled profile shipped for the board's kind
(profiles/NAME.json), which every report then calls modelled.

An emulated board is this machine with less RAM: its hardware is measured outside the memory
limit (the operator profiler runs nodes on real inputs and may need more than the limit) by
`measuring_board`, and the profile's RAM is then the limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.formats import FormatError, Profile, load_profile
from edge_remat_agent.formats.fields import dump_text

from ..devices import DeviceConfig
from ..page_folder import page_dir_params, page_folder
from ..shipped import shipped_dir
from ..transport.host_pages import link_pages

PROFILES_DIR = shipped_dir("profiles")
# Small and quick: a few sizes and short power windows keep the first run well under a minute.
QUICK_PARAMS = {"sizes": [64 * 2**10, 2**20, 8 * 2**20], "idle_s": 0.5, "busy_s": 0.5}
# Part of the cache key: raised when the profiler starts measuring something plans use, so that
# a profile cached before is measured again rather than planned with the older figures
# (2: tiers carry their measured transfer curves; 3: the board's measured compute rates; 4: an
# update's timing windows no longer train the model the in-context steps are timed on; 5: the
# flash's reads of a weight file, which a model's frozen weights cost; 6: flash pages of
# 32 MiB and more read straight into memory, not through a staging copy; 7: the runtime's
# memory measured with an hf: or MODULE:FACTORY model built, not torch alone).
PROFILER_REVISION = 7


@dataclass
class ChosenProfile:
    profile: Optional[Profile]
    path: Optional[Path]
    how: str  # "given" | "cached" | "measured" | "modelled" | "none"
    cached_at: Optional[Path] = None  # its copy in the profile cache, if it has one

    def forget(self) -> bool:
        """Take the profile out of the cache (the next run measures again); whether it was.
        The index of profiles `edge-remat profile` measured forgets it too, which offered it
        again to the next run (QA): its cached copy has the very bytes of the file noted."""
        if self.cached_at is None or not self.cached_at.is_file():
            return False
        forget_profiled(_file_digest(self.cached_at))
        self.cached_at.unlink()
        return True

    def describe(self) -> str:
        if self.profile is None:
            return "none: costs are the graph's FLOP/byte estimate"
        p = self.profile
        power = " (power: model estimate, no sensor)" if p.device.get("power_estimate") else ""
        # a board without room for a plain step: its nodes timed by a planned run (node_times)
        from ..node_times import FIGURES_KEY
        in_run = ", its nodes timed in a planned run" if p.measurements.get(FIGURES_KEY) else ""
        return f"{p.name} — {p.source.upper() if p.source == 'modelled' else p.source}" \
               f"{power}{in_run}, {self.how}"

    def summary(self) -> dict:
        p = self.profile
        return {"name": p.name if p else None, "source": p.source if p else None,
                "modelled": bool(p and p.source == "modelled"), "how": self.how,
                "path": str(self.path) if self.path else None,
                "power_estimate": bool(p and p.device.get("power_estimate"))}


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edge-remat" / "profiles"


def board_identity(board: dict) -> dict:
    """What makes a board the same board for its profiles (not an emulated memory limit)."""
    return {k: board.get(k) for k in ("hostname", "board", "machine", "system", "cpu_count",
                                      "ram_total_bytes", "torch", "python")}


def cache_key(board: dict, model: dict, folder: Optional[str] = None) -> str:
    """The same board (its identity, not an emulated memory limit), page folder (`folder`,
    page_folder: the flash the profile measured; QA, a config paging to a 20 MiB tmpfs planned
    with the root disk's flash measured for another config) and model (as it trains:
    model_key) share a profile."""
    content = {"board": board_identity(board), "model": model_key(model),
               "profiler": PROFILER_REVISION,
               **({"page_folder": folder} if folder is not None else {})}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def model_key(model: dict) -> dict:
    """The run's model options (`model`: RunOptions.model_info) as the cache keys them: a zoo
    model's --batch and shape option at its default, or one it does not read, are as if not
    given (zoo_shapes.effective_shape), as they train the same graph. QA: `run --model mlp`
    and the same run with --batch 8 (mlp's default) each measured the board (~20 s). Written
    as not given, not as the default's value, so that the profiles cached of runs that gave
    none keep their keys; a model not in the zoo keeps what was given."""
    from edge_remat_agent.zoo_shapes import effective_shape
    name, shape = model.get("model"), ("batch", "image", "seq")
    trains = effective_shape(name, *(model.get(option) for option in shape))
    default = effective_shape(name, None, None, None)
    return {**model, **{option: None if trains[option] == default[option] else trains[option]
                        for option in shape if option in model}}


# -- profiles that `edge-remat profile --graph` measured -------------------------------------
# Indexed by board and graph fingerprint, so that a run of the same graph on the same board
# plans with one rather than measure again (QA: `profile --device local --graph g.json --out P`
# and then `run` of the same model and batch measured again, ~30 s, with no word of P).
PROFILED_INDEX = "profiled-graphs.json"
PROFILED_KEPT = 64  # the newest entries; a file moved or removed is dropped as it is seen


def _board_key(board, folder: Optional[str] = None) -> str:
    """The board (its identity) and the page folder its profiles measured (default: the one
    its device config gives, page_folder), with the profiler's revision."""
    if folder is None:
        folder = page_folder(board.device)
    content = {"board": board_identity(board.sysinfo()), "profiler": PROFILER_REVISION,
               "page_folder": folder}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def _profiled_entries() -> list:
    try:
        entries = json.loads((cache_dir() / PROFILED_INDEX).read_text())
        return [e for e in entries if isinstance(e, dict) and Path(str(e.get("path"))).is_file()]
    except (OSError, ValueError, TypeError):
        return []


def remember_profiled(board, fetched: "list[str | Path]", folder: Optional[str] = None) -> None:
    """A profile a board's profile job measured of a graph (its `measurements.ops`
    graph_fingerprint), noted in the cache's index for runs of that graph on that board and
    page folder (`folder`, default the board's config's: page_folder; choose_profile). Nothing
    is noted where it cannot be: no index is no worse than before."""
    for path in fetched:
        path = Path(path).resolve()
        if path.name != "profile.json":
            continue
        try:
            measured = load_profile(path)
            fingerprint = (measured.measurements.get("ops") or {}).get("graph_fingerprint")
            if not fingerprint or not measured.ops or \
                    measured.measurements.get("tiers_not_measured"):
                continue
            entries = [e for e in _profiled_entries() if e.get("path") != str(path)]
            entries.append({"path": str(path), "board": _board_key(board, folder),
                            "graph_fingerprint": fingerprint})
            _write_profiled(entries)
        except (OSError, FormatError, ValueError):
            continue


def _write_profiled(entries: list) -> None:
    cache_dir().mkdir(parents=True, exist_ok=True)
    dump_text(json.dumps(entries[-PROFILED_KEPT:], indent=1), cache_dir() / PROFILED_INDEX)


def forget_profiled(digest: "str | None") -> None:
    """Drop the index's entries whose profile file holds these bytes (`digest`, _file_digest):
    a profile a run found far off its steps is not offered again; the file itself stays where
    `edge-remat profile` wrote it. Where the index cannot be written, it is left as it is."""
    entries = _profiled_entries() if digest is not None else []
    kept = [e for e in entries if _file_digest(Path(e["path"])) != digest]
    if len(kept) < len(entries):
        try:
            _write_profiled(kept)
        except OSError:
            pass


def _file_digest(path: Path) -> "str | None":
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _profiled_earlier(board, graph_path: Path,
                      folder: Optional[str] = None) -> "tuple[Profile, Path] | None":
    """The newest profile `edge-remat profile` measured of this very graph (its fingerprint)
    on this board (its identity and the profiler's revision) in page folder `folder` (default
    the board's config's, page_folder), if one is still where it was."""
    entries = _profiled_entries()
    if not entries:
        return None
    try:
        from edge_remat_agent.formats import load_graph
        fingerprint = load_graph(graph_path).fingerprint()
    except (OSError, FormatError, ValueError):
        return None
    key = _board_key(board, folder)
    for entry in reversed(entries):
        if entry.get("board") == key and entry.get("graph_fingerprint") == fingerprint:
            try:
                return load_profile(entry["path"]), Path(entry["path"])
            except (OSError, FormatError):
                continue
    return None


MODELLED_FOR = {"android-termux": "android-phone"}  # device config -> modelled profile


def modelled_profile_for(device: DeviceConfig) -> Optional[Path]:
    path = PROFILES_DIR / f"{MODELLED_FOR.get(device.name, device.name)}.json"
    return path if path.is_file() else None


def choose_profile(board, device: DeviceConfig, model: dict, graph_path: Path, out_dir: Path,
                   given: Optional[str] = None, reprofile: bool = False,
                   measuring_board: Optional[Callable[[], object]] = None,
                   say: Callable[[str], None] = lambda message: None,
                   handed=None) -> ChosenProfile:
    """`board` is the connected transport.Board the run trains on; `measuring_board()` opens
    the one that measures it, when that is another (an emulated board's unlimited twin).
    `handed`: the host's capture of the graph (handed.HandedCapture), for the profile job."""
    if given:
        return _limited(ChosenProfile(load_profile(given), Path(given), "given"), device)
    folder = page_folder(device)  # where the run pages: its profile's flash is measured there
    key = cache_key(board.sysinfo(), model, folder)
    cached = cache_dir() / f"{key}.json"
    profile = _cached(cached, say) if not reprofile else None
    if profile is not None:
        if profile.ops or not _room_now(board, graph_path, measuring_board):
            return _limited(ChosenProfile(profile, cached, "cached", cached), device)
        say(f"{board.name}: the cached profile timed no nodes (there was no room for a plain "
            "step when it was measured); there is now, so it is measured again")
    elif not reprofile and \
            (earlier := _profiled_earlier(board, graph_path, folder)) is not None:
        profile, path = earlier
        say(f"{board.name}: planning with {path}, which `edge-remat profile` measured of this "
            f"graph on this board (--profile {path} names it; --reprofile measures again)")
        cached = _cache(profile, path, cached, board.name, say)
        return _limited(ChosenProfile(profile, path, "cached", cached), device)
    if "profile" in board.hello().get("job_kinds", {}):
        # the run's page folder, measured by the board that measures (an emulated board's
        # twin, on this machine, in the emulated board's folder)
        pages = page_dir_params(device) if measuring_board is None else \
            {"page_dir": os.path.abspath(os.path.expanduser(folder))}
        if measuring_board is None:
            fetched = _measure(board, model, graph_path, out_dir, pages, folder, say, handed)
        else:
            with measuring_board() as twin:
                try:
                    fetched = _measure(twin, model, graph_path, out_dir, pages, folder, say,
                                       handed)
                finally:  # a failed job too: the twin's agent would idle for an hour
                    twin.stop_agent()
        measured = load_profile(fetched)
        cached = _cache(measured, fetched, cached, board.name, say)
        return _limited(ChosenProfile(measured, fetched, "measured", cached), device)
    modelled = modelled_profile_for(device)
    if modelled is not None:
        say(f"{device.name}: its agent cannot measure; planning with the modelled {modelled.name}")
        return ChosenProfile(load_profile(modelled), modelled, "modelled")
    return ChosenProfile(None, None, "none")


def _cached(path: Path, say: Callable[[str], None]):
    """The cached profile, None where there is none; a damaged one (a disk's fault, an edit)
    is measured again, where it stopped every run on that board until someone removed it."""
    if not path.is_file():
        return None
    try:
        return load_profile(path)
    except FormatError as damaged:
        say(f"warning: the cached profile is damaged ({damaged}); it is measured again")
        return None


def _room_now(board, graph_path: Path, measuring_board) -> bool:
    """Whether the board that measures (`board` itself, unless an emulated board's twin does)
    now has room for a plain step of the graph, as a profile job times its nodes in."""
    if measuring_board is not None:
        return True  # the unlimited twin: its room is this machine's
    from ..profile_fit import plain_step_out_of_reach
    return not plain_step_out_of_reach(board, graph_path)


def _limited(chosen: ChosenProfile, device: DeviceConfig) -> ChosenProfile:
    """On an emulated board the RAM is the memory limit, whatever the machine has; over a
    serial link there is no host tier, whatever the profile measured (one cached over SSH for
    the same board, or given: QA, a plan paged to the host, then the run job refused it)."""
    limit = device.hardware.memory_limit_bytes
    if chosen.profile is not None and limit:
        chosen.profile.ram_total_bytes = limit
    if chosen.profile is not None and device.connection.kind == "serial":
        chosen.profile.tiers.pop("host", None)
    return chosen


def _cache(measured: Profile, fetched: Path, cached: Path, board: str,
           say: Callable[[str], None]) -> Optional[Path]:
    """The measured profile (`measured`, read from `fetched`) copied into the cache (the
    copy's path), or None where it is not cached: a tier it lost while measuring (the host
    link), so that the next run measures again rather than refuse --paging host until
    --reprofile; or a cache folder that cannot be written (an unwritable HOME: measured again
    next time, no worse)."""
    missing = measured.measurements.get("tiers_not_measured")
    if missing:
        say(f"{board}: the profile is not cached: its {' and '.join(sorted(missing))} tier "
            "was not measured")
        return None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fetched, cached)
    except OSError as exc:
        say(f"warning: cannot cache the profile in {cached.parent} "
            f"({exc.strerror or exc}); set XDG_CACHE_HOME to a writable folder")
        return None
    return cached


def _measure(board, model: dict, graph_path: Path, out_dir: Path, pages: dict, folder: str,
             say: Callable[[str], None], handed=None) -> Path:
    """The board's profile job (a board without room for a plain step: without the nodes,
    which a short planned run then times, profile_under_plan.py); the fetched file. `pages`:
    the jobs' page_dir param (page_dir_params), the flash the run pages to, noted in the
    index of profiled graphs as `folder` (page_folder). `handed`: the host's capture of the
    graph (handed.HandedCapture), which a board of this machine's kind need not trace again."""
    from ..profile_fit import plain_step_out_of_reach
    from ..remote import fetched_json
    # the footprint probe builds the model as the run will: an hf: model's runtime holds
    # transformers too (QA: without it, a budget from --memory-limit missed ~200 MiB of gpt2's
    # and the planned run was killed at step 1)
    params = dict(QUICK_PARAMS, model=model["model"], **pages)
    inputs = {"graph": graph_path}
    why = plain_step_out_of_reach(board, graph_path)
    if why:
        say(f"warning: {why}")
        # nor would the footprint probe hold the model beside torch: the bare runtime's
        inputs, params["model"] = {}, None
    else:
        say(f"{board.name}: profiling every graph node, the flash, power and memory")
    hand = handed.to(board) if handed is not None and inputs else \
        contextlib.nullcontext(({}, {}))
    with link_pages(board, say) as page_params, hand as (handed_params, handed_inputs):
        record = board.run_job("profile", {**params, **page_params, **handed_params},
                               {**inputs, **handed_inputs}, out_dir / "profile")
    remember_profiled(board, record["fetched"], folder)
    fetched = fetched_json(record)
    if not fetched:
        raise RuntimeError(f"the profile job on {board.name} returned no profile file")
    # A graph with parameters on flash is profiled as the graph with them in RAM (its update
    # nodes' flash traffic is costed apart): its planned run would time that traffic too.
    if why and model.get("grouped_for") != "flash":
        from edge_remat_agent.formats import load_graph

        from ..profile_under_plan import time_nodes_under_plan
        from ..remote import progress_printer
        time_nodes_under_plan(board, load_graph(graph_path), str(graph_path), fetched[0],
                              pages.get("page_dir"), say, progress_printer(say))
    return fetched[0]


# A measured profile whose steps run this many times faster or slower than it predicted was
# not measured as the run trains (a busy machine, other shapes): the planned run's own misses
# are within 1.1-1.7x here; a profile measured beside other heavy work missed by 16-53x.
PROFILE_TRUST_RATIO = 3.0
# ... and whose steps' time it missed by more than this: a small model's step is mostly work the
# plan does not time (mlp, 2 steps: 0.024 s predicted, 0.126 s a step), which a new profile
# would miss again, so forgetting it only cost every next run a profile (QA: 5 of 7 small runs).
PROFILE_TRUST_S = 0.25


# Steps a run needs for that verdict: the first pays the warm-up, and one step after it alone
# is noise on a busy host (QA: three of four 2-step runs forgot the profile they had just
# measured, at 0.08x, 107x and 0.04x, the next run profiling again), so two at least.
VERDICT_STEPS = 3


def forget_if_far_off(report: dict, chosen: ChosenProfile,
                      say: Callable[[str], None]) -> None:
    """Take a cached profile whose prediction missed the steady steps by more than
    PROFILE_TRUST_RATIO and PROFILE_TRUST_S out of the cache, and say so: otherwise every
    later run plans on it."""
    from ..reports.run_report import steady_median
    steps = report.get("step_time_s") or []
    typical, _ = steady_median(steps, report.get("job_start"))
    predicted = report.get("predicted_time_s")
    if len(steps) < VERDICT_STEPS or not typical or not predicted:
        return  # a first step pays the warm-up, and one step after it is no verdict either
    ratio = typical / predicted
    if 1 / PROFILE_TRUST_RATIO <= ratio <= PROFILE_TRUST_RATIO or \
            abs(typical - predicted) <= PROFILE_TRUST_S or not chosen.forget():
        return
    missed = f"the profile predicted {predicted:.3g} s a step and the steps took {typical:.3g} s " \
        f"({ratio:.2f}x)"
    if chosen.profile is not None and not chosen.profile.ops:
        # A board without room for a plain step: its nodes were costed from the capture's
        # estimates at its measured rates, which can miss for the model's op mix as well.
        why = ("its compute rates were likely measured while this machine was busy, or the "
               "capture's estimates miss this model's ops (the profile timed none of its "
               "nodes)")
    else:
        why = "it was likely measured while this machine was busy, or for other shapes"
    note = f"{missed}: {why}; it is out of the profile cache now, so the next run measures again"
    report["profile"] = {**report.get("profile", {}), "forgotten": True}
    report["misses"] = [*report.get("misses", []), note]
    say(f"warning: {note}")

