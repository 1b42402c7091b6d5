"""Makes `runtime_helpers` importable by the runtime tests (pytest runs in importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
