"""What `edge-remat graph` reports about a captured (or imported) graph."""

from __future__ import annotations

from typing import Any

from edge_remat_agent.formats import Graph

from ..units import fmt_bytes


def graph_summary(graph: Graph, plain_peak: int, output: str | None) -> dict[str, Any]:
    cap = graph.capture
    return {
        "model": cap.get("model", graph.name), "batch": graph.batch, "dtype": graph.dtype,
        "captured_nodes": cap.get("captured_nodes"), "nodes": len(graph),
        # an operator-level graph's nodes are single ops: the module level it split is no
        # figure of it (capture["level"] stays in the file, for recapture)
        "level": None if cap.get("operator_level") else cap.get("level"),
        "operator_level": bool(cap.get("operator_level")), "fixed_bytes": graph.fixed_bytes,
        "fixed": cap.get("fixed"), "saved_bytes": cap.get("saved_bytes"),
        "plain_peak_bytes": plain_peak, "capture_s": cap.get("capture_s"),
        "optimizer": cap.get("optimizer"), "cost_source": graph.cost_source,
        "planning_only": graph.planning_only, "fingerprint": graph.fingerprint(),
        "graph": output,
        # mixed precision (--trainable-dtype): said only where the graph has it
        **({"trainable_dtype": trained} if (trained := (cap.get("source") or {}).get(
            "trainable_dtype")) else {}),
    }


def graph_table(summary: dict[str, Any]) -> str:
    fixed = summary.get("fixed") or {}
    parts = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in fixed.items()
                      if k != "total" and v)
    level = ", one per ATen op that allocates" if summary.get("operator_level") else \
        f", level {summary['level']}" if summary.get("level") is not None else ""
    rows = [
        ("model", f"{summary['model']} (batch {summary['batch']}"
                  + (f", {summary['dtype']}" if summary.get("dtype") else "")
                  + (f", trained in {summary['trainable_dtype']}"
                     if summary.get("trainable_dtype") else "") + ")"
                  + ("  [planning only]" if summary["planning_only"] else "")),
        ("nodes", f"{summary['captured_nodes']} captured -> {summary['nodes']} planner nodes"
                  f"{level}"),
        ("fixed memory", f"{fmt_bytes(summary['fixed_bytes'])}" + (f" ({parts})" if parts else "")),
        ("saved for backward", fmt_bytes(summary["saved_bytes"])),
        ("plain peak", fmt_bytes(summary["plain_peak_bytes"])),
        ("costs", f"{summary['cost_source']} (optimizer {summary['optimizer']})"),
        ("capture time", f"{summary['capture_s']:.2f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
