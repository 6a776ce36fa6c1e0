"""What to install on which board, for the "no python" and "no torch" errors."""

from __future__ import annotations

PYTHON = {
    "jetson": "install it with `sudo apt install python3` (JetPack 4 ships Python 3.6, too old "
              "for the agent: `sudo apt install python3.8` and set python = \"python3.8\")",
    "rpi": "install it with `sudo apt install python3` (Raspberry Pi OS)",
    "android": "install it in Termux with `pkg install python` and set python = \"python\"",
    "generic": "install Python 3.8 or newer on the board, or set `python` in the device "
               "config to its path",
}

TORCH = {
    "jetson": "install NVIDIA's PyTorch wheel for the board's JetPack release (see "
              "https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-platform/); "
              "PyPI's aarch64 wheels have no CUDA for Jetson",
    "rpi": "install it with `pip install torch` (64-bit Raspberry Pi OS; PyPI has aarch64 "
           "wheels; on Bookworm use a venv or --break-system-packages)",
    "android": "install it in Termux with `pkg install python-torch` (if it is not found: "
               "`pkg install x11-repo` first)",
    "generic": "install it with `pip install torch` for the Python the config names",
}

MIN_PYTHON = (3, 8)


def python_hint(family: str) -> str:
    return PYTHON.get(family, PYTHON["generic"])


def torch_hint(family: str) -> str:
    return TORCH.get(family, TORCH["generic"])
