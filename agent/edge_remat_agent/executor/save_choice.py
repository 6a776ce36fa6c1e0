"""What a run saves of its trained weights (`--save`), the file's name, and the checkpoint's
(`--checkpoint-every`, `--resume`): without torch, so
that the run job reads them before its capture (traced in a child process while this one has
not imported torch: executor/jobs.py) and the host's command line loads no torch for them."""

from __future__ import annotations

from .errors import BadInput

SAVE_CHOICES = ("trained", "all", "none")
DEFAULT_SAVE = "trained"
WEIGHTS_FILE = "weights.pt"  # the run job's output file, fetched by the host


def check_save_choice(which: str) -> str:
    if which not in SAVE_CHOICES:
        raise BadInput(f"unknown save choice {which!r}: use {' | '.join(SAVE_CHOICES)}")
    return which

# A run's checkpoint (`--checkpoint-every`, executor/checkpoint.py): the run job's output file,
# replaced after every N-th step, which `--resume` continues from.
CHECKPOINT_FILE = "checkpoint.pt"


# Options a resume may change, though a checkpoint written before they could recorded them in
# its identity: --lr (the remedy of a run that diverged is to go on from its last good
# checkpoint with a smaller one; the checkpoint's lr_history says which steps took which).
MAY_CHANGE_ON_RESUME = ("--lr",)
WHAT_TRAINS = ("--graph", "--model")
BY_CONTENT = ("--init",)  # held by the sha256 of the file's content, not its path


def identity_mismatch(earlier: dict, now: dict) -> str | None:
    """The first option (a command-line name, e.g. "--batch") whose value differs between
    the run a checkpoint was written by (`earlier`) and the run resuming from it (`now`), in
    words; None when they agree. The identity is the options a resumed run must share with
    its first part to train as one uninterrupted run would (MAY_CHANGE_ON_RESUME aside).
    What trains (the model, deploy's graph) is said before how (QA: a checkpoint of mlp,
    resumed as digits-cnn, was said to differ in --batch)."""
    if ("--graph" in earlier) != ("--graph" in now):  # deploy's identity names its graph
        made, this = ("deploy", "run") if "--graph" in earlier else ("run", "deploy")
        return (f"the checkpoint was written by `edge-remat {made}`, and this is `edge-remat "
                f"{this}`: resume it with `edge-remat {made} ... --resume`, or start afresh "
                "without --resume")
    earlier, now = _effective(earlier), _effective(now)
    differing = sorted((set(earlier) | set(now)) - set(MAY_CHANGE_ON_RESUME),
                       key=lambda option: (option not in WHAT_TRAINS, option))
    for option in differing:
        if earlier.get(option) != now.get(option):
            shown = _file_shown if option in BY_CONTENT else _shown
            return (f"the checkpoint's run had {option} {shown(earlier.get(option))}, this "
                    f"run has {shown(now.get(option))}: give {option} as it was (a resumed run "
                    "trains as the uninterrupted one would), or start afresh without --resume")
    return None


def _effective(identity: dict) -> dict:
    """The identity at the values the run trains at, not as typed: a zoo model's shapes
    not given are its defaults, and the one it does not read is none (zoo_shapes); a
    --trainable-dtype not given is --dtype's. (QA: `--batch 256 --image 24`, digits-cnn's
    defaults, was refused against the run that gave neither.) A checkpoint written before
    this holds the options as given, and is compared the same way."""
    from ..zoo_shapes import effective_shape
    resolved = dict(identity)
    if "--model" in identity:
        shape = effective_shape(identity["--model"], identity.get("--batch"),
                                identity.get("--image"), identity.get("--seq"))
        resolved.update({f"--{name}": value for name, value in shape.items()})
    if "--trainable-dtype" in identity and resolved["--trainable-dtype"] is None:
        resolved["--trainable-dtype"] = identity.get("--dtype") or "fp32"
    return resolved


def _file_shown(value) -> str:
    """A file the identity holds by its content's sha256 (QA: the bare hash read as a path)."""
    return "(not given)" if value is None else f"(a file whose sha256 begins {str(value)[:12]})"


def _shown(value) -> str:
    if value is None:
        return "(not given)"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)
