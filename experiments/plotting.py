"""Saving the experiment scripts' matplotlib figures the same way everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spantrain._figures import glyphs_may_be_missing

__all__ = ["save_figure"]


def save_figure(fig: Any, path: Path, dpi: float | str = "figure") -> Path:
    """Lay out, write and close `fig` (closing frees it: scripts draw several); returns `path`."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    with glyphs_may_be_missing():
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
