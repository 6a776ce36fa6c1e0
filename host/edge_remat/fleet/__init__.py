"""`edge-remat fleet plan MANIFEST.toml`: plan many models for many boards and budgets, each
(model, board, budget) a Ray task (manifest.py, tasks.py, backends.py, runner.py)."""
