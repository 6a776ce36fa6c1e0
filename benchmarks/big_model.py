"""A 1.1-billion-parameter Llama (TinyLlama-1.1B's shape, LoRA r=8 on q and v) fine-tuned under
a 2 GiB memory cgroup on this machine: its fp32 weights alone are 4.4 GB.

    python benchmarks/big_model.py [--model tinyllama-1.1b-lora] [--limit 2GiB] [--steps 2]
        [--exact] [--no-plain]

Prints: plain PyTorch's peak (the planner's plain reference plus the runtime; measured too with
--exact, outside the limit) and what the limit does to it; the planned peak; the kernel's peak
under the limit; the runtime baseline; the step time; the bytes read from the weight page store
per step and the share of the IO thread's time (the plan's reads ahead) hidden behind compute;
the flash read bandwidth achieved against the profile's. `--exact` also trains the same plan
and plain PyTorch in this process, outside the limit, and checks that the LoRA parameters
after the steps are equal bit for bit (plain needs ~5 GB here: run it alone).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "host"), str(REPO / "agent")]

from edge_remat.devices import write_local_device  # noqa: E402

from arguments import positive_int, positive_size, zoo_model  # noqa: E402 - a neighbour

PROFILE = REPO / "profiles" / "this-machine.json"
MiB, GiB = 2**20, 2**30


def board_config(root: Path) -> str:
    """A local device of its own (workdir, page directory): its weight store is kept there."""
    write_local_device(root / "configs", "big-model-board", root / "board",
                       page_dir=root / "pages")
    os.environ["EDGE_REMAT_DEVICE_CONFIGS"] = str(root / "configs")
    return "big-model-board"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=zoo_model, default="tinyllama-1.1b-lora")
    parser.add_argument("--limit", type=positive_size, default="2GiB")  # bytes
    parser.add_argument("--steps", type=positive_int, default=2)
    parser.add_argument("--seq", type=positive_int, default=128)
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(),
                                                        "edge-remat-big-model"))
    parser.add_argument("--no-plain", action="store_true")
    parser.add_argument("--exact", action="store_true")
    args = parser.parse_args()

    from edge_remat.run import RunOptions, run

    limit = args.limit
    root = Path(args.root)
    device = board_config(root)
    common = dict(device=device, model=args.model, memory_limit=limit, seq=args.seq,
                  optimizer="adamw", steps=args.steps, data="text", plots=False)
    profile = json.loads(PROFILE.read_text())
    print(f"{args.model}, seq {args.seq}, AdamW on the LoRA parameters, {args.steps} steps, "
          f"limit {limit / GiB:.2f} GiB ({PROFILE.name})")

    start = time.perf_counter()
    planned = run(RunOptions(**common, params_home="flash", check_gradients=False,
                             profile=str(PROFILE), time_limit=30, out=str(root / "planned")),
                  say=lambda line: print("  " + line, file=sys.stderr))
    wall = time.perf_counter() - start
    board = json.loads((root / "planned" / "board" / "run_report.json").read_text()) \
        if planned["status"] == "finished" else {}
    runtime = profile.get("runtime_baseline_bytes") or 0
    print(f"plain peak (planner's plain reference):   {planned['plain_peak_bytes'] / GiB:6.2f} "
          f"GiB + runtime {runtime / GiB:.2f} GiB = "
          f"{(planned['plain_peak_bytes'] + runtime) / GiB:.2f} GiB")
    if not args.no_plain:
        plain = run(RunOptions(**common, plain=True, out=str(root / "plain")))
        print(f"plain PyTorch under the limit:            {plain['status']} "
              f"({plain['message']}), kernel peak {(plain.get('kernel_peak_bytes') or 0) / GiB:.2f}"
              " GiB")
    print(f"planned run:                              {planned['status']} "
          f"({planned['message']}; {wall:.0f} s wall, capture and planning included)")
    print(f"budget / planned peak:                    {planned['budget_bytes'] / GiB:6.2f} / "
          f"{planned['predicted_peak_bytes'] / GiB:.2f} GiB")
    if board:
        print(f"tensor peak measured (ledger):            "
              f"{max(s['ledger_peak_bytes'] for s in board['steps']) / GiB:6.2f} GiB")
    kernel = planned.get("kernel_peak_bytes") or 0
    print(f"kernel peak under the limit:              {kernel / GiB:6.2f} GiB of "
          f"{limit / GiB:.2f} GiB ({'below' if kernel < limit else 'NOT below'} it)")
    print(f"runtime baseline (profile):               {runtime / GiB:6.2f} GiB")
    times = planned.get("step_time_s") or []
    if times:
        print(f"step time:                                {times[-1]:6.1f} s (steps: "
              + ", ".join(f"{t:.1f}" for t in times) + f"; predicted "
              f"{planned['predicted_time_s']:.1f} s)")
    weights = board.get("weights")
    if weights:
        steps = len(board["steps"])
        flash_bw = profile["tiers"]["flash"]["read_bytes_per_s"]
        print(f"read from the weight page store per step: {weights['bytes_read'] / steps / GiB:6.2f}"
              f" GiB ({weights['reads'] / steps:.0f} reads, O_DIRECT: {weights['direct_io']})")
        last = board["steps"][-1]  # the plan's reads ahead, on the executor's IO thread
        if last.get("home_read_s"):
            io_s = last["home_read_s"] + last["page_in_s"] + last["page_out_s"]
            print(f"IO thread's time hidden behind compute:   "
                  f"{100 * max(0.0, 1 - last['io_wait_s'] / io_s):6.1f} % (last step: waited "
                  f"{last['io_wait_s']:.1f} s of {io_s:.1f} s; "
                  f"{planned.get('home_reads', 0)} reads from home ahead)")
        if weights.get("prefetch_groups"):  # the store's own read-ahead (plans made sync)
            hidden = weights["hidden_share"]
            print(f"store's reading hidden behind compute:   {100 * hidden:6.1f} % (waited "
                  f"{weights['wait_s']:.1f} s of {weights['read_s']:.1f} s reading)")
        print(f"flash read bandwidth achieved:            {weights['read_bytes_per_s'] / 1e6:6.0f}"
              f" MB/s (profile: {flash_bw / 1e6:.0f} MB/s, {weights['read_bytes_per_s'] / flash_bw:.2f}x)")
        written = weights.get("written")
        if written:
            print(f"weight page store written once:           {written['bytes'] / GiB:6.2f} GiB "
                  f"in {written['seconds']:.0f} s")
    if args.exact:
        exact(args)
    return 0 if planned["status"] == "finished" and kernel < limit else 1


def exact(args) -> None:
    """The plan run here (outside the limit, same weight store code) against plain PyTorch:
    the LoRA parameters after the steps, bit for bit."""
    import torch

    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import solve
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.capture.models import load_model
    from edge_remat_agent.capture.optimizer import torch_optimizer
    from edge_remat_agent.executor.batches import batch_source
    from edge_remat_agent.executor.gradcheck import deterministic
    from edge_remat_agent.executor.run import run_plan
    from edge_remat_agent.executor.step import plain_step
    from edge_remat_agent.formats import load_profile

    captured = capture_model(args.model, seq=args.seq, optimizer="adamw", params_home="flash")
    problem = build_problem(captured.graph, 1536 * MiB, load_profile(str(PROFILE)), "time",
                            None, None)
    plan = solve(problem, "heuristic:split").plan
    with tempfile.TemporaryDirectory(prefix="edge-remat-exact-") as pages:
        run_plan(captured.graph, plan, args.steps, pages, data="text", captured=captured,
                 seed=0, check_gradients=False, keep_parameters=True)
    lora = {n: p.detach().clone() for n, p in captured.module.named_parameters()
            if p.requires_grad}
    del captured
    module, example_args = load_model(args.model, seq=args.seq)
    optimizer = torch_optimizer("adamw", module)
    batches = batch_source("text", example_args, torch.device("cpu"), 0)
    torch.manual_seed(0)
    with deterministic(torch.device("cpu")):
        for i in range(args.steps):
            plain_step(module, optimizer, batches(i))
    plain = dict(module.named_parameters())
    equal = all(torch.equal(plain[n].detach(), value) for n, value in lora.items())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"exactness (outside the limit):            {len(lora)} LoRA tensors after "
          f"{args.steps} steps {'EQUAL' if equal else 'DIFFERENT'} to plain PyTorch bit for "
          f"bit; this process's peak RSS (plain) {peak / GiB:.2f} GiB")


if __name__ == "__main__":
    sys.exit(main())
