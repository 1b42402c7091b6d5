"""`spantrain run`: not implemented yet (issue #6)."""

from __future__ import annotations

import argparse

from spantrain.cli._common import not_yet


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=not_yet("run", 6))
