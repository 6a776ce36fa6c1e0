"""The CI end-to-end setting (tests/test_run_e2e.py), which the ResNet-18 example takes as its
defaults (tests/test_examples.py checks that they agree)."""

LIMIT_MIB = 600
# Plain ResNet-18 at batch 48 needs ~833 MiB; the plan at 65% ~500 MiB in the cgroup.
MODEL = ("--model", "resnet18", "--batch", 48, "--image", 32)
BUDGET = "65%"
STEPS = 5
