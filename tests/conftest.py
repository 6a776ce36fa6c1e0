import sys
from pathlib import Path

# Let the tests import their shared helpers as `helpers.NAME` (tests/helpers/).
sys.path.insert(0, str(Path(__file__).resolve().parent))
