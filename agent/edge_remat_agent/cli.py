"""`edge-remat-agent`: the board-side command. Standard library only (torch where it runs models)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__, profile_command, profile_storage, run_command


def _check_plan(args: argparse.Namespace) -> int:
    from .costs import plan_costs
    from .formats import FormatError, load_graph, load_plan
    from .simulate import PlanError, simulate
    try:
        graph, plan = load_graph(args.graph), load_plan(args.plan)
        if plan.graph_fingerprint and plan.graph_fingerprint != graph.fingerprint():
            raise FormatError(args.plan, "graph_fingerprint",
                              f"{graph.fingerprint()} (the graph on this board)",
                              plan.graph_fingerprint)
        result = simulate(graph, plan_costs(graph, plan), plan.stages, plan.budget_bytes)
    except (FormatError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"valid": True, "fits_budget": result.fits_budget,
                      "peak_bytes": result.peak_bytes, "budget_bytes": plan.budget_bytes}))
    return 0 if result.fits_budget else 1


def _setup_logging(verbose: bool = False) -> None:
    import logging
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")


def _serve(args: argparse.Namespace) -> int:
    """`serve`: the daemon itself (--tcp / --daemon) or a relay to it (--stdio / --serial)."""
    from .daemon.layout import Layout
    layout = Layout(args.workdir).ensure()
    if args.stdio:
        from .daemon.launcher import DaemonUnavailable, serve_stdio
        _setup_logging(args.verbose)
        try:
            return serve_stdio(layout)
        except DaemonUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 3
    if args.serial:
        from .daemon.launcher import serve_serial
        _setup_logging(args.verbose)
        try:
            return serve_serial(layout, args.serial, args.baud)
        except (OSError, ValueError) as exc:
            print(f"error: cannot serve on {args.serial}: {exc}", file=sys.stderr)
            return 2
    from .daemon.server import AlreadyRunning, Daemon
    _setup_logging(args.verbose)
    try:
        daemon = Daemon(layout, tcp=args.tcp, idle_exit_s=args.idle_exit)
        daemon.start()
    except (AlreadyRunning, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if daemon.tcp_address:
        print(f"listening on {daemon.tcp_address[0]}:{daemon.tcp_address[1]}", flush=True)
    daemon.serve_forever()
    return 0


def _stop(args: argparse.Namespace) -> int:
    from .daemon.launcher import stop_daemon
    from .daemon.layout import Layout
    from .wire.protocol import RemoteError
    try:
        print(stop_daemon(Layout(args.workdir), if_idle=args.if_idle))
    except RemoteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _sysinfo(args: argparse.Namespace) -> int:
    from .daemon.identity import own_build
    from .daemon.layout import Layout
    from .daemon.sysinfo import collect
    print(json.dumps(collect(Layout(args.workdir).ensure().root, own_build()), indent=1))
    return 0


def _run_job(args: argparse.Namespace) -> int:
    from .daemon.layout import Layout
    from .daemon.runner import run_job_process
    return run_job_process(Layout(args.workdir), args.job)


def _run_job_args(argv: list[str]) -> argparse.Namespace:
    """`_run-job`: the daemon's own command, parsed apart so that no help lists it (argparse
    before 3.14 prints a suppressed subcommand as `==SUPPRESS==`)."""
    parser = argparse.ArgumentParser(prog="edge-remat-agent _run-job")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--job", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_run-job"]:
        return _run_job(_run_job_args(argv[1:]))
    parser = argparse.ArgumentParser(prog="edge-remat-agent",
                                     description="The edge-remat agent that runs on the board.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the agent's version")
    check = sub.add_parser("check-plan", help="validate a plan against a graph on this board")
    check.add_argument("plan")
    check.add_argument("--graph", required=True)

    workdir_help = "the agent's working directory (default: $EDGE_REMAT_WORKDIR or ~/edge-remat)"
    serve = sub.add_parser("serve", help="serve the host's requests and run its jobs")
    how = serve.add_mutually_exclusive_group(required=True)
    how.add_argument("--stdio", action="store_true",
                     help="relay stdin/stdout to this workdir's daemon (started if needed); "
                          "what the host runs over an SSH exec channel")
    how.add_argument("--tcp", metavar="127.0.0.1:PORT",
                     help="run the daemon here, also listening on a loopback TCP port "
                          "(reach it through an SSH port forward); PORT 0 picks one")
    how.add_argument("--serial", metavar="DEVICE",
                     help="serve the host on a serial line (e.g. /dev/ttyGS0), relaying to "
                          "the daemon")
    how.add_argument("--daemon", action="store_true",
                     help="run the daemon here on its Unix socket only")
    serve.add_argument("--baud", type=int, default=921600, help="serial baud rate")
    serve.add_argument("--workdir", help=workdir_help)
    serve.add_argument("--idle-exit", type=float, default=None, metavar="S",
                       help="exit after S seconds with no job and no connection")
    serve.add_argument("-v", "--verbose", action="store_true")
    stop = sub.add_parser("stop", help="stop this workdir's daemon cleanly")
    stop.add_argument("--workdir", help=workdir_help)
    stop.add_argument("--if-idle", action="store_true", help="only when no job runs or waits")
    info = sub.add_parser("sysinfo", help="print python/torch versions, free RAM and disk")
    info.add_argument("--workdir", help=workdir_help)
    profile_storage.add_parser(sub)
    profile_command.add_parser(sub)
    run_command.add_parser(sub)

    args = parser.parse_args(argv)
    positionals = [action.dest for action in sub.choices[args.command]._actions
                   if not action.option_strings]
    if (empty := _empty_value(argv, [d for d in positionals if getattr(args, d) == ""])):
        print(f"error: {empty}", file=sys.stderr)
        return 2
    if args.command == "version":
        print(__version__)
        return 0
    handlers = {"check-plan": _check_plan, "serve": _serve, "stop": _stop,
                "sysinfo": _sysinfo,
                "profile-storage": profile_storage.run, "profile": profile_command.run,
                "run": run_command.run}
    if args.command not in ONE_LINE_ERRORS or os.environ.get("EDGE_REMAT_DEBUG"):
        return handlers[args.command](args)
    try:
        return handlers[args.command](args)
    except Exception as exc:  # noqa: BLE001 - what no handler foresaw: one line, not a traceback
        lines = str(exc).splitlines()
        print(f"error: {args.command} stopped: {type(exc).__name__}: "
              f"{lines[0] if lines else ''} (EDGE_REMAT_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


def _empty_value(argv: list[str], empty_positionals: list[str]) -> str | None:
    """The error where an option or argument is given as '' (an unset shell variable): the
    commands would read it as left out, or as this folder ('--graph ""' was "'.' is a
    directory"). -o keeps its own words (output_names.empty_name, said by each command).
    `empty_positionals`: the names of the positional arguments parsed as '', in order."""
    positionals = iter(empty_positionals)
    for k, token in enumerate(argv):
        option = argv[k - 1] if k and argv[k - 1].startswith("-") else None
        if token.startswith("--") and token.endswith("="):
            option, token = token[:-1], ""
        if token.strip() or option in ("-o", "--output"):
            continue
        if option is None:
            name = next(positionals, None)
            option = f"the {name} argument" if name else "an argument"
        return f"{option} is empty: give a value"
    return None


# The commands a person runs on the board: an error nobody foresaw (a model's own code raising
# in the gradient check's eager step, say) is one line there. The daemon's commands keep their
# tracebacks, for its log.
ONE_LINE_ERRORS = ("check-plan", "profile-storage", "profile", "run")


def run_as_process() -> None:
    """main() as the whole process (`python -m edge_remat_agent`, the agent's archive), its
    exit without the last garbage collections (process_exit.py)."""
    from .process_exit import skip_exit_collections
    status = main()
    skip_exit_collections()
    sys.exit(status)


if __name__ == "__main__":
    run_as_process()
