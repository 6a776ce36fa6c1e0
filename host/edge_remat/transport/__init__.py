"""Reaching boards: local child process, SSH (paramiko) and serial (pyserial) transports that all
speak the agent's wire protocol, and `Board`, which reconnects and resumes over flaky links.

    errors.py   one-line errors (unknown host key, auth refused, no python/torch, out of disk)
    zipapp.py   the agent as one deterministic .pyz
    session.py  requests over one connection, chunked file transfer
    local.py / ssh.py / serial.py   the transports
    emulated.py a local board inside a memory cgroup (--memory-limit, emulated-board)
    board.py    Board: reconnect + resume, run_job (push inputs, submit, wait, fetch outputs)
"""

from .board import Board, make_transport
from .errors import (AgentError, AuthRefused, BoardMissingPython, BoardMissingTorch,
                     BoardOutOfDisk, BoardUnreachable, HostKeyChanged, HostKeyUnknown,
                     JobFailed, JobOutOfReach, LinkLost, TransportError)

__all__ = ["Board", "make_transport", "AgentError", "AuthRefused", "BoardMissingPython",
           "BoardMissingTorch", "BoardOutOfDisk", "BoardUnreachable", "HostKeyChanged",
           "HostKeyUnknown", "JobFailed", "JobOutOfReach", "LinkLost", "TransportError"]
