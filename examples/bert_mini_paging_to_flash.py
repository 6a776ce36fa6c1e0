"""Fine-tune the zoo's BERT-mini classifier with activations paged out to flash and back.

`--paging flash` lets the planner choose, per tensor, between keeping it, dropping and
recomputing it, or writing it to the board's flash (its page directory) and reading it back
before the backward pass needs it, by the profile's figures for each: where the board's
measured flash costs less than recomputing it pages, where it costs more it recomputes, and
the last line says which. The board's agent executes the page-outs and page-ins for real
(checksummed files); the report counts them and shows the gradients still equal eager
PyTorch's bit for bit. Which it does turns on the flash's `compute_share` in the profile
(what its IO takes from compute where no core is spare). Measured 2026-12-07 on the shared
2-core host, `python examples/bert_mini_paging_to_flash.py --steps 3` twice, each run profiling
the board first (load average 5-8), the budget 70% (156.4 MiB of plain 223.5 MiB):
  - share 0 (its pairs' slowdowns -45 to 1.1: noise under the load, clipped): 14 tensors paged
    out and back a step, 63.56 MiB, none recomputed; steps 3.44-4.85 s, 3.05 s predicted;
  - share 0.92: none paged, 11 recomputations; steps 2.70-2.80 s, 3.66 s predicted.
Both trained with the gradients equal to eager PyTorch's bit for bit. The share decided it:
`edge-remat plan` of each run's graph with its profile's share swapped for the other's gives
the other's choice (at 0: 14 page-outs, no recomputation; at 0.92: 11 recomputations, and 1
page-out with the first run's other figures).
A share that noisy is no longer planned with: the profiler now pools the pairs and, where
they are too noisy or too few, takes the IO thread's own CPU per IO second instead (0.05-0.36
on this host with torch's 2 threads) and says so; with 0.19-0.7 the first run's graph still
pages 14 tensors (docs/paging.md, "compute_share").

    python examples/bert_mini_paging_to_flash.py --steps 3
    python examples/bert_mini_paging_to_flash.py --device rpi5 --budget 60% --steps 10

The board is profiled for this model first (every node of its graph, its flash's bandwidth;
cached for later runs, as is a profile `edge-remat profile --device local --graph G` measured
of the same graph). --profile FILE names one; profiles/this-machine.json is not one for this
model: it timed digits-cnn's graph, none of BERT-mini's nodes, so their times would be
estimates. The data is the model's example batch (random token ids and labels) every step.
"""

import argparse

from edge_remat.run import RunOptions, run
from edge_remat.reports.run_report import report_text
from edge_remat.units import fmt_bytes, parse_budget


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="local")
    parser.add_argument("--budget", default="70%")
    parser.add_argument("--objective", default="energy", choices=("time", "energy"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--memory-limit", default=None, help="e.g. 600MiB: an emulated board")
    parser.add_argument("--profile", default=None, help="a profile JSON (skips profiling)")
    parser.add_argument("--out", default="bert-mini-run")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    limit = int(parse_budget(args.memory_limit)[1]) if args.memory_limit else None
    report = run(RunOptions(device=args.device, model="bert-mini", batch=args.batch,
                            seq=args.seq, budget=args.budget, objective=args.objective,
                            paging="flash", steps=args.steps, memory_limit=limit,
                            profile=args.profile, time_limit=5, out=args.out), say=print)
    print(report_text(report))
    print(f"\n{report['status']}: {report['page_outs']} page-outs and {report['page_ins']} "
          f"page-ins to flash a step ({fmt_bytes(report.get('paged_bytes'))} paged), "
          f"{report['recomputed']} recomputations; loss {report['loss'][0]:.3f} -> "
          f"{report['loss'][-1]:.3f}")


if __name__ == "__main__":
    from edge_remat.errors import run_script
    run_script(main)  # a failure ends in one `error:` line, as the CLI's do
