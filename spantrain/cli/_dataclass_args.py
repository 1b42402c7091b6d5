"""Command-line flags generated from a keyword-only config dataclass.

Each field becomes `--field-name`, typed from its default, with the field's docstring
(the string literal under it in the class body) as help, so configs are documented once.
Errors that name a field as ``Config.field`` name its flag instead (`flags_in_errors`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import itertools
import re
import textwrap
import typing
from collections.abc import Iterator
from typing import Any

from spantrain.errors import SpantrainError

__all__ = ["field_docs", "add_dataclass_args", "given_args", "dataclass_from_args", "flag", "flags_in_errors"]


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass, by field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs = {}
    for node, nxt in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def add_dataclass_args(p: argparse.ArgumentParser, cls: type, skip: set[str] = frozenset()) -> None:
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or f.default is dataclasses.MISSING:
            continue
        name = flag(f.name)
        default = f.default
        # a tuple is given as A,B,... and shown so; None has nothing to show (the field's own
        # doc says what it means), where "(default: None)" contradicted a documented default
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = docs.get(f.name, "") + ("" if default is None else f" (default: {shown})")
        if isinstance(default, bool):
            p.add_argument(name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif isinstance(default, tuple):
            p.add_argument(name, metavar="A,B,...", default=None, help=help_text)
        elif default is None:
            p.add_argument(name, default=None, type=_scalar_type(hints[f.name]), help=help_text)
        else:
            p.add_argument(name, type=type(default), default=None, help=help_text)


def flag(field_name: str) -> str:
    """The command-line flag of a config field."""
    return "--" + field_name.replace("_", "-")


@contextlib.contextmanager
def flags_in_errors(cls: type, *alike: type) -> Iterator[None]:
    """Inside, a `SpantrainError` naming a field of `cls` as ``Cls.field`` names its flag
    instead (``TrainConfig.n_envs`` -> ``--n-envs``): the config speaks to library users,
    the command line to the person who typed the flag. `alike`: configs built from `cls`
    whose fields of the same names are `cls`'s (``EnvConfig.max_devices``)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    names = "|".join(c.__name__ for c in (cls, *alike))

    def to_flag(m: re.Match) -> str:
        return flag(m.group(1)) if m.group(1) in fields else m.group(0)

    try:
        yield
    except SpantrainError as e:
        e.args = (re.sub(rf"\b(?:{names})\.(\w+)", to_flag, str(e)),)
        raise


def _scalar_type(hint: Any) -> type:
    for arg in typing.get_args(hint):
        if arg in (int, float):
            return arg
    return str


def given_args(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `cls` whose flags the user gave, parsed (A,B,... into a tuple)."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if isinstance(f.default, tuple):
            value = tuple(x.strip() for x in str(value).split(",") if x.strip())
        kwargs[f.name] = value
    return kwargs


def dataclass_from_args(cls: type, args: argparse.Namespace, **overrides: Any):
    """An instance of `cls` from the flags the user gave (others keep their defaults)."""
    return cls(**{**given_args(cls, args), **overrides})
