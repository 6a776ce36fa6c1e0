"""The daemon's "profile" job: what `edge-remat profile --device NAME [--graph G]` starts.

params: graph (optional, the pushed graph's board path) and any option of
`edge-remat-agent profile` by its long name (page_dir, sensor, idle_s, busy_s, op_window_s,
sizes, no_footprint, ...), and traced and traced_key (the host's own trace of the graph, kept
where it is this board's: capture/handed.py). page_dir defaults to <workdir>/pages. Writes
profile.json (fetched by the host into its --out folder) and returns the profile's summary.
"""

from __future__ import annotations

from ..daemon.layout import job_page_dir
from ..daemon.registry import BadParam, JobContext, JobParams


def profile_options(read: JobParams):
    """The profile job's options from its params (a JobParams; registry.refuse_bad_params reads
    them where the job is submitted, its page_dir and graph as the board would read them)."""
    from ..capture.handed import PARAMS as HANDED
    from .measure import ProfileOptions
    # the host's own trace of the graph, if it handed one (profile_job), is no option
    options = {k: v for k, v in read.params.items() if k not in HANDED}
    graph = read.input_path("graph")
    if graph is not None:
        options["graph"] = str(graph)
    options["page_dir"] = job_page_dir(options.get("page_dir"),
                                       read.ctx.workdir if read.ctx is not None else ".")
    try:
        return ProfileOptions.from_params(options)
    except ValueError as error:  # names the param, as the agent's own profile options
        raise BadParam(str(error)) from None


def profile_job(ctx: JobContext, params: dict) -> dict:
    from .measure import measure_profile, profile_summary, to_stderr
    from .profile_writer import write_profile
    from ..capture.handed import keep_handed
    read = JobParams(params, ctx, "profile")
    options = profile_options(read)
    keep_handed(read, options.graph)  # the host's own trace, where it is this board's

    def progress(index: int, total: int, node) -> None:
        ctx.check_cancelled()
        ctx.progress((index + 1) / total, f"node {index + 1}/{total} {node.name}: "
                     f"{node.time_s:.3g} s x {node.runs}")

    def phase(message: str) -> None:  # each phase's line to the host: some take minutes
        to_stderr(message)
        ctx.check_cancelled()
        ctx.progress(None, message)  # no share of the whole: a phase after the nodes is not 0%

    profile = measure_profile(options, progress, phase)
    ctx.progress(1.0, "profile measured")  # QA: a finished profile was listed "finished 0%"
    write_profile(profile, ctx.files_dir / "profile.json")
    return {"files": ["profile.json"], **profile_summary(profile, "profile.json")}
