"""Fine-tune ResNet-18 on an emulated 600 MiB board: plain PyTorch is killed, the plan finishes.

The setting of the CI test (tests/test_run_e2e.py): this machine runs the agent inside a memory
cgroup of 600 MiB. Plain training of ResNet-18 (32x32 images, batch 48) needs ~830 MiB and is
killed at step 1; the plan at 65% of the plain peak recomputes what it drops, finishes, and its
gradients equal eager PyTorch's bit for bit. Prints both outcomes and the planned run's report.

    python examples/finetune_resnet18_emulated.py --profile profiles/this-machine.json
    python examples/finetune_resnet18_emulated.py --steps 10 --batch 64 --budget 65%

Without --profile the board is profiled first (minutes; cached for later runs). The emulated
board needs root for its memory cgroup. 65% is about the smallest budget ResNet-18's graph
allows (one coarse backward node needs its inputs and output at once): 30% is infeasible here.
The data is the model's example batch every step (ResNet-18 has no bundled data set), so the
loss falls as the network fits that batch.
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
    parser.add_argument("--budget", default="65%")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--profile", default=None, help="a profile JSON (skips profiling)")
    parser.add_argument("--skip-plain", action="store_true", help="only the planned run")
    parser.add_argument("--out", default="resnet18-run")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    limit = int(parse_budget(args.memory_limit)[1])

    def options(**changes) -> RunOptions:
        return RunOptions(device=args.device, model="resnet18", batch=args.batch,
                          image=args.image, data="example", steps=args.steps,
                          memory_limit=limit, profile=args.profile, **changes)

    if not args.skip_plain:
        plain = run(options(plain=True, out=f"{args.out}/plain"), say=print)
        print(f"plain PyTorch: {plain['message']} (kernel peak "
              f"{fmt_bytes(plain.get('kernel_peak_bytes'))} of {fmt_bytes(limit)})")
    planned = run(options(budget=args.budget, paging="none", time_limit=5,
                          out=f"{args.out}/planned"), say=print)
    print(report_text(planned))
    print(f"\nplanned: {planned['status']}, kernel peak "
          f"{fmt_bytes(planned.get('kernel_peak_bytes'))} of {fmt_bytes(limit)}, loss "
          f"{planned['loss'][0]:.3f} -> {planned['loss'][-1]:.3f}")


if __name__ == "__main__":
    from edge_remat.errors import run_script
    run_script(main)  # a failure ends in one `error:` line, as the CLI's do
