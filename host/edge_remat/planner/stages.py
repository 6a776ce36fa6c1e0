"""Stage decisions, and the one lowering step from decisions to a plan's instructions.

Every solver answers in the same shape (Checkmate's "frontier-advancing" stages, extended with
paging): stage t computes node t for the first time, after recomputing some earlier nodes; it
pages some tensors in at its start and some out at its end, and keeps a set of tensors in RAM for
the next stage. Lowering places the instructions exactly where the solvers' memory accounting
assumes them:

  1. page-ins, at the start of the stage;
  2. computes in ascending node order, each followed by freeing the tensors that have no later use
     in this stage and are neither kept nor paged out;
  3. page-outs, at the end of the stage;
  4. frees of whatever else is resident and not kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_remat_agent.formats import Instruction, Stages

from .problem import Problem


class LoweringError(ValueError):
    """Decisions that do not make a schedule: a bug in the solver that produced them."""


@dataclass
class StageDecision:
    compute: list[int]  # ascending; the last one is the stage's own node
    keep: set[int]  # resident at the start of the next stage
    page_in: list[tuple[int, str]] = field(default_factory=list)
    page_out: list[tuple[int, str]] = field(default_factory=list)


def is_plain(decisions: list[StageDecision]) -> bool:
    """Whether a schedule computes every node once and pages nothing: nothing to improve."""
    return all(len(d.compute) == 1 and not d.page_in and not d.page_out for d in decisions)


def lower_stage(p: Problem, t: int, d: StageDecision, ram: set[int],
                tiers: dict[str, set[int]]) -> tuple[list[Instruction], int]:
    """Instructions of stage t and its peak RAM (with fixed memory). Updates ram and tiers."""
    ids = p.ids
    out: list[Instruction] = []
    resident = sum(p.sizes[i] for i in ram)
    peak = p.fixed + resident
    for i, tier in d.page_in:
        if i not in tiers.get(tier, ()) or i in ram:
            raise LoweringError(f"stage {t}: page_in {ids[i]!r} from {tier} is not possible")
        out.append(Instruction("page_in", ids[i], tier))
        ram.add(i)
        resident += p.sizes[i]
        peak = max(peak, p.fixed + resident)
    computed = set(d.compute)
    paged_out = {i for i, _ in d.page_out}
    if not d.compute or d.compute[-1] != t or sorted(computed) != d.compute:
        raise LoweringError(f"stage {t}: computes {d.compute} must ascend and end with {t}")
    for k in d.compute:
        missing = [ids[i] for i in p.deps[k] if i not in ram]
        if missing or k in ram:
            raise LoweringError(f"stage {t}: compute {ids[k]!r} with inputs {missing} missing "
                                f"or its output already resident")
        out.append(Instruction("compute", ids[k]))
        ram.add(k)
        resident += p.sizes[k]
        peak = max(peak, p.fixed + resident + p.workspace[k])
        for i in (*p.deps[k], k):
            later = any(j > k and j in computed for j in p.users[i])
            if not later and i not in d.keep and i not in paged_out:
                out.append(Instruction("free", ids[i]))
                ram.discard(i)
                resident -= p.sizes[i]
    for i, tier in d.page_out:
        if i not in ram:
            raise LoweringError(f"stage {t}: page_out {ids[i]!r}, which is not in RAM")
        out.append(Instruction("page_out", ids[i], tier))
        ram.discard(i)
        tiers.setdefault(tier, set()).add(i)
    for i in sorted(ram - d.keep):
        out.append(Instruction("free", ids[i]))
        ram.discard(i)
    if ram != d.keep:
        raise LoweringError(f"stage {t}: keeps {sorted(ids[i] for i in d.keep - ram)}, "
                            "which are not in RAM")
    return out, peak


def lower(p: Problem, decisions: list[StageDecision]) -> tuple[Stages, int]:
    """The whole schedule and its peak RAM."""
    if len(decisions) != p.n:
        raise LoweringError(f"{len(decisions)} stages for {p.n} nodes")
    decisions = no_recompute_after_update(p, decisions)
    ram: set[int] = set()
    tiers: dict[str, set[int]] = {}
    stages, peak = [], p.fixed
    for t, d in enumerate(decisions):
        instructions, stage_peak = lower_stage(p, t, d, ram, tiers)
        stages.append(instructions)
        peak = max(peak, stage_peak)
    return stages, peak


def no_recompute_after_update(p: Problem, decisions: list[StageDecision]) -> list[StageDecision]:
    """The decisions with every recompute of a parameter reader after its update replaced: the
    update steps the parameters in place, so computed again the reader would use the new
    weights. Its value from before the update is paged in where a copy was paged out, else
    kept in RAM from its last computation. CP-SAT's and the MILP's models forbid such a
    recompute, so their plans pass unchanged; the heuristics do not model it (it is rare: a
    backward node freed, then needed by a user recomputed in a later stage), and the
    evaluation's replay counts the memory their repaired plans take."""
    if not p.stepped:
        return decisions
    last: dict[int, int] = {}  # node -> stage of its last computation
    paged: dict[int, str] = {}  # node -> a tier holding a copy of its value
    out = decisions
    for t, d in enumerate(decisions):
        for i in d.compute:
            update = p.stepped.get(i)
            if update is None or t <= update:
                last[i] = t
                continue
            if out is decisions:
                out = [StageDecision(list(e.compute), set(e.keep), list(e.page_in),
                                     list(e.page_out)) for e in decisions]
            out[t].compute.remove(i)
            if i in paged:
                out[t].page_in.append((i, paged[i]))
            else:
                for s in range(last[i], t):
                    out[s].keep.add(i)
        for i, tier in d.page_out:
            paged[i] = tier
    return out
