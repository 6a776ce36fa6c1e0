"""Fine-tune the digits CNN on a board whose RAM plain PyTorch training does not fit, from Python.

What `edge-remat run` does, as a script to copy: plain training first (the comparison), then the
plan, both under the same memory limit, then the loss and the memory side by side.

    python examples/finetune_digits.py                        # this machine, 580 MiB cgroup
    python examples/finetune_digits.py --device rpi4 --no-limit --budget 40%

The emulated board (the default) needs root for its memory cgroup.
"""

import argparse

from edge_remat.run import RunOptions, run
from edge_remat.reports.run_report import report_text
from edge_remat.units import fmt_bytes, parse_budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="local")
    parser.add_argument("--memory-limit", default="580MiB")
    parser.add_argument("--no-limit", action="store_true", help="a real board: its RAM is it")
    parser.add_argument("--budget", default="25%")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="digits-run")
    args = parser.parse_args()
    limit = None if args.no_limit else int(parse_budget(args.memory_limit)[1])

    def options(**changes) -> RunOptions:
        return RunOptions(device=args.device, model="digits-cnn", data="digits",
                          steps=args.steps, memory_limit=limit, **changes)

    plain = run(options(plain=True, out=f"{args.out}/plain"), say=print)
    print(f"plain PyTorch: {plain['message']}")
    planned = run(options(budget=args.budget, out=f"{args.out}/planned"), say=print)
    print(report_text(planned))
    print(f"\nplain: {plain['status']}, kernel peak {fmt_bytes(plain.get('kernel_peak_bytes'))}; "
          f"planned: {planned['status']}, kernel peak "
          f"{fmt_bytes(planned.get('kernel_peak_bytes'))}, loss {planned['loss'][0]:.3f} -> "
          f"{planned['loss'][-1]:.3f}")


if __name__ == "__main__":
    from edge_remat.errors import run_script
    run_script(main)  # a failure ends in one `error:` line, as the CLI's do
