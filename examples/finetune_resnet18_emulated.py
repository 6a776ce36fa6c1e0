"""Fine-tune ResNet-18 on an emulated 600 MiB board: plain PyTorch is killed, the plan finishes.

The setting of the CI test (tests/test_run_e2e.py): this machine runs the agent inside a memory
cgroup of 600 MiB. Plain training of ResNet-18 (32x32 images, batch 48) needs ~830 MiB and is
killed at step 1; the plan recomputes what it drops, finishes, and its gradients equal eager
PyTorch's bit for bit. Prints both outcomes and the planned run's report.

    python examples/finetune_resnet18_emulated.py
    python examples/finetune_resnet18_emulated.py --steps 10 --batch 64 --budget 65%

The board is profiled for this model first (a few minutes) and the profile cached: later runs
reuse it (so does a profile `edge-remat profile --device local --graph G` measured of the same
graph; --profile FILE names one). Without --budget the plan takes what the memory limit leaves
after the runtime the profile measured and the 160 MiB a run keeps for the allocator's slack,
so that no warning is due (here 227 MiB, 64% of the plain peak; the CI test's --budget 65%
left 158 MiB for it, and said so). 30% is infeasible without paging: its graph needs at least
145.9 MiB (one backward node needs its two inputs in RAM at once, beside 85.9 MiB of fixed
memory). The data is the model's example batch every step
(ResNet-18 has no bundled data set), so the loss falls as the network fits that batch.
"""

import argparse

from edge_remat.run import RunOptions, run
from edge_remat.reports.run_report import report_text
from edge_remat.units import fmt_bytes, parse_budget


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="local", help="a local device to emulate with")
    parser.add_argument("--memory-limit", default="600MiB")
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--budget", default=None,
                        help="default: what the memory limit leaves (see above)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--profile", default=None,
                        help="a profile JSON of this model's graph (skips profiling)")
    parser.add_argument("--skip-plain", action="store_true", help="only the planned run")
    parser.add_argument("--out", default="resnet18-run")
    return parser.parse_args(argv)


def run_options(args: argparse.Namespace) -> "tuple[RunOptions, RunOptions]":
    """The plain run's options and the planned run's. The plain run takes no profile: a
    profile shapes a plan, and plain training has none (it warned, and ignored it)."""
    limit = int(parse_budget(args.memory_limit)[1])

    def options(**changes) -> RunOptions:
        return RunOptions(device=args.device, model="resnet18", batch=args.batch,
                          image=args.image, data="example", steps=args.steps,
                          memory_limit=limit, **changes)

    return (options(plain=True, out=f"{args.out}/plain"),
            options(budget=args.budget, paging="none", profile=args.profile, time_limit=5,
                    out=f"{args.out}/planned"))


def main(argv=None) -> None:
    args = parse_args(argv)
    limit = int(parse_budget(args.memory_limit)[1])
    plain_options, planned_options = run_options(args)
    if not args.skip_plain:
        plain = run(plain_options, say=print)
        print(f"plain PyTorch: {plain['message']} (kernel peak "
              f"{fmt_bytes(plain.get('kernel_peak_bytes'))} of {fmt_bytes(limit)})")
    planned = run(planned_options, say=print)
    print(report_text(planned))
    print(f"\nplanned: {planned['status']}, kernel peak "
          f"{fmt_bytes(planned.get('kernel_peak_bytes'))} of {fmt_bytes(limit)}, loss "
          f"{planned['loss'][0]:.3f} -> {planned['loss'][-1]:.3f}")


if __name__ == "__main__":
    from edge_remat.errors import run_script
    run_script(main)  # a failure ends in one `error:` line, as the CLI's do
