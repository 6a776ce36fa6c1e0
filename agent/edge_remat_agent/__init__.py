"""What runs on the board: executor, profiler, sensors, page stores, and the formats both sides share.

Depends only on the standard library (and torch where it executes models), because it is copied
onto boards where installing things is hard.
"""

__version__ = "0.1.0"
