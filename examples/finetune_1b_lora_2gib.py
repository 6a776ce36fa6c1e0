"""Fine-tune a 1.1-billion-parameter Llama (TinyLlama-1.1B's shape, LoRA r=8 on q and v) on a
board with 2 GiB of RAM: its fp32 weights alone are 4.4 GB.

    python examples/finetune_1b_lora_2gib.py [--steps 3] [--memory-limit 2GiB] [--no-plain]

What it does, on this machine as an emulated board (a memory cgroup; needs root):
  1. builds the model on the `meta` device (no weights in RAM) and writes its frozen weights,
     tensor by tensor, to the weight page store in the board's page directory (once: later
     runs find the file);
  2. plain PyTorch training under the limit: killed (exit status 4 from the CLI), with the
     kernel's peak;
  3. the planned run under the same limit: the frozen base read back from the store with
     O_DIRECT while the layers compute, activations and LoRA state planned, a few AdamW steps
     on the bundled text (byte-level tokens, no download), and the report.

The same from the command line:

    edge-remat run --device local --memory-limit 2GiB --model tinyllama-1.1b-lora --seq 128 \\
        --optimizer adamw --params-home flash --steps 3 --no-grad-check

(--no-grad-check: the gradient check needs plain training's memory, 4.4 GB, on the host;
benchmarks/big_model.py checks the LoRA weights against plain PyTorch bit for bit instead.)

The first planned run profiles the board for this model's graph (outside the limit, with the
weights in RAM) and caches the profile, which later runs plan with: on the shared 2-core host,
2026-12-07, the profile took 389 s, and the run of 3 steps with it cached 125 s (steps 24.2-26.5
s against 24.7 s predicted; docs/memory.md). profiles/this-machine.json, which this example
planned with before, is digits-cnn's profile from another machine and times none of its nodes.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tinyllama-1.1b-lora")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--memory-limit", default="2GiB")
    parser.add_argument("--device", default="local")
    parser.add_argument("--out", default="edge-remat-1b")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain run")
    args = parser.parse_args()

    from edge_remat.run import RunOptions, run
    from edge_remat.reports.run_report import report_text
    from edge_remat.transport.emulated import find_board
    from edge_remat.units import parse_budget
    from edge_remat_agent.capture.models import load_model
    from edge_remat_agent.weights import WEIGHTS_FOLDER, deferred_weights, ensure_model_weights

    limit = int(parse_budget(args.memory_limit)[1])
    # the board --memory-limit emulates, whose page folder (beside the device's own) the run
    # reads the store from: the store written to the device's own was never read
    device = find_board(args.device, limit)
    page_dir = os.path.expanduser(device.hardware.page_dir or "pages")

    with deferred_weights():  # on meta: nothing allocated for 4.4 GB of weights
        module, _ = load_model(args.model, seq=128)
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    print(f"{args.model}: {sum(p.numel() for p in module.parameters()) / 1e9:.2f} B "
          f"parameters, {size / 1e9:.2f} GB in fp32, built on {next(module.parameters()).device}")
    path, written = ensure_model_weights(module, args.model, 0,
                                         os.path.join(page_dir, WEIGHTS_FOLDER))
    if written:
        print(f"wrote the weight page store {path}: {written['bytes'] / 1e9:.2f} GB in "
              f"{written['seconds']:.1f} s ({written['write_bytes_per_s'] / 1e6:.0f} MB/s)")
    else:
        print(f"weight page store already there: {path}")

    common = dict(device=args.device, model=args.model, memory_limit=limit, seq=128,
                  optimizer="adamw", steps=args.steps, data="text", plots=False)
    if not args.no_plain:
        plain = run(RunOptions(**common, plain=True, out=f"{args.out}/plain"))
        peak = plain.get("kernel_peak_bytes") or 0
        print(f"plain PyTorch: {plain['status']} ({plain['message']}; kernel peak "
              f"{peak / 2**30:.2f} GiB of {limit / 2**30:.2f} GiB)")
    planned = run(RunOptions(**common, params_home="flash", check_gradients=False,
                             time_limit=20, out=f"{args.out}/planned"),
                  say=lambda line: print(line, file=sys.stderr))
    print(report_text(planned))
    return 0 if planned["status"] == "finished" else 4


if __name__ == "__main__":
    from edge_remat.errors import run_script
    run_script(main)  # a failure ends in one `error:` line, as the CLI's do
