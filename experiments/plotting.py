"""Saving the experiment scripts' matplotlib figures the same way everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["save_figure"]


def save_figure(fig: Any, path: Path, dpi: float | str = "figure") -> Path:
    """Lay out, write and close `fig` (closing frees it: scripts draw several); returns `path`."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
