"""What the executor and the op profiler ask of an accelerator: to finish its queued work
before a clock is read (CUDA kernels run asynchronously: without it a timer measures their
launch), and its caching allocator's peaks. On the CPU there is nothing to wait for and the
process's resident set is the measure (no allocator peaks here)."""

from __future__ import annotations

import torch

from .device_kinds import TORCH_DEVICES


def unavailable(device: torch.device | str) -> str | None:
    """Why torch cannot run on `device` on this board (None where it can): a device config
    that names the board's GPU (`torch_device = "cuda"`) where torch has no CUDA."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        return f"unknown torch device {device!r}: use {' or '.join(TORCH_DEVICES)}"
    if kind == "cuda" and not torch.cuda.is_available():
        return (f"this board's torch cannot use CUDA (torch {torch.__version__}: "
                "torch.cuda.is_available() is False). Remedy: install a CUDA build of torch "
                "(on a Jetson, NVIDIA's wheel for its JetPack), or run on the CPU: "
                "torch_device = \"cpu\" in the device config's [hardware] (the agent's own "
                "commands: --device cpu)")
    if kind not in TORCH_DEVICES:
        return f"torch device {device!r}: this agent runs on {' or '.join(TORCH_DEVICES)}"
    return None


def synchronize(device: torch.device | str | None) -> None:
    """Wait until `device` has run everything queued on it."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def release_cached(device: torch.device) -> None:
    """Give the caching allocator's free blocks back to the driver. After the gradient
    check's plain step the allocator kept that step's blocks reserved for the whole run (on a
    Jetson they are the board's DRAM): operator-level bert-mini's planned steps on an H200
    kept 656 MiB reserved, the reference's, against 189 MiB planned (docs/boards.md)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def allocated_peak(device: torch.device) -> int | None:
    """The allocator's peak of bytes in tensors since the last reset (None on the CPU)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def reserved_peak(device: torch.device) -> int | None:
    """The allocator's peak of bytes taken from the driver (tensors, the caching allocator's
    cached blocks and its rounding) since the last reset: what the board's memory pays."""
    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None
