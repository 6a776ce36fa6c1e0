"""The host side of edge-remat: CLI, graph import, planner, transports, deploy, reports."""

from edge_remat_agent import __version__

__all__ = ["__version__"]
