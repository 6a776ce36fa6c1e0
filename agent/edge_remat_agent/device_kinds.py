"""The kinds of torch device an agent runs its jobs on. Kept free of torch so that the host
checks a device config's `torch_device` against the same list the agent refuses others by."""

TORCH_DEVICES = ("cpu", "cuda")
