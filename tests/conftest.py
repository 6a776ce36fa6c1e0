import sys
from pathlib import Path

# Let the tests import their helpers (small_graphs, brute_force) as plain modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
