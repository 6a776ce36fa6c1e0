"""What the host shows: tables of plans, sweeps, replays and graphs (report.py, graph_report.py),
the run report of planned against measured (run_report.py) and its PNG plots (plots.py)."""
