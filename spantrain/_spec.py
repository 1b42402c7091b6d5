"""Small helpers shared by the spec, workload and plan parsers, and by what writes files.

The parsers' helpers check one field at a time and append a message that names the entry
to a list of problems, so a loader can report every problem of a file at once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import reprlib
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_structured", "read_text_file", "parse_json", "write_text_atomic", "save_text", "replace_file",
           "cannot_write_in",
           "require_writable_dir", "check_keys", "is_figure", "positive_number", "nonneg_number", "positive_int",
           "nonempty_str", "fmt_number",
           "got", "plural", "FIGURE_MIN", "FIGURE_MAX", "readable", "cannot_create", "other_kind", "FULL_DISK_BYTES",
           "DISK_FULL", "free_if_full"]

FIGURE_MIN, FIGURE_MAX = 1e-30, 1e30
"""Range of a positive figure (the most a figure >= 0 may be): far beyond any real device,
link or layer, yet narrow enough that unit conversions and the cost model's products stay
finite (1e300 TFLOP/s is an infinite FLOP/s, 1e-307 TFLOP/s an infinite layer time)."""

MAX_FILE_BYTES = 256 * 2**20
"""Largest spec, plan, workload or calibration file read (a 4,096-device spec with measured
layer times is a few MB): /dev/zero given as a file otherwise filled the memory."""

# A number in exponent form that YAML 1.1 (PyYAML) reads as a string: no dot or an unsigned exponent.
_EXP_NUMBER = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?[eE]([+-]?)(\d+)")


def read_structured(path: str | Path, error: type[Exception]) -> Any:
    """Parse a YAML or JSON file (by suffix; YAML otherwise) or raise `error` in one line."""
    text = read_text_file(path, error)
    p = Path(path)
    try:
        data = _parse_text(p, text, error)
    except ValueError as e:  # Python converts at most 4,300 digits to an int, by default
        if "integer string conversion" not in str(e):
            raise
        raise error(f"{p}: {_HUGE_INT}") from None
    except RecursionError:  # both parsers recurse per level: [[[[...]]]] exhausts the stack
        raise error(f"{p}: nested too deeply to read (spec, plan and workload files are a few levels "
                    "deep; check the brackets)") from None
    if _has_huge_int(data):
        raise error(f"{p}: {_HUGE_INT}")
    return data


def read_text_file(path: str | Path, error: type[Exception]) -> str:
    """The text of a UTF-8 file, or `error` in one line naming it: missing, a directory, a pipe or
    device, larger than `MAX_FILE_BYTES`, not UTF-8."""
    if not isinstance(path, str | os.PathLike):  # Cluster.from_file(None) was a TypeError from Path()
        raise error(f"expected the path of a file, got {shown(path)}")
    p = Path(path)
    if str(path) == "-" and not p.exists():  # not standard input, as some tools take it: said so
        raise error("-: reading from standard input is not supported; save it to a file and pass that file's path")
    if not p.exists():
        if p.is_symlink():  # exists() follows it: a loop, or a link whose target is missing, said as such
            try:
                p.resolve(strict=True)
            except FileNotFoundError:
                raise error(f"{p}: is a symbolic link to {os.readlink(p)}, which does not exist") from None
            except (OSError, RuntimeError):  # RuntimeError: Python 3.11's "Symlink loop"
                raise error(f"{p}: cannot be read (a loop of symbolic links)") from None
        raise error(f"{p}: file not found")
    if p.is_dir():
        raise error(f"{p}: is a directory, expected a file")
    try:
        data = _read_regular_file(p, error)
    except OSError as e:
        raise error(f"{p}: cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_FILE_BYTES:
        raise error(f"{p}: larger than {MAX_FILE_BYTES // 2**20} MB, which no spec, plan or workload file is: pass "
                    "the right file")
    try:
        text = data.decode("utf-8-sig")  # an editor's byte-order mark is no reason to refuse a file
    except UnicodeDecodeError:
        raise error(f"{p}: not a UTF-8 text file (save it as UTF-8 YAML or JSON)") from None
    return text


def _read_regular_file(p: Path, error: type[Exception]) -> bytes:
    """Up to `MAX_FILE_BYTES` + 1 bytes of the regular file `p`, else `error`: a named pipe
    blocked the command until something wrote into it, a device (/dev/zero) may never end, and
    /dev/stdin is the terminal or a pipe (a file redirected in is read). Opened without blocking
    and checked on the open file, so a pipe swapped in meanwhile is refused too."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "a device")
            raise error(f"{p}: is {kind}, not a regular file; save what it gives to a file and pass that file's "
                        "path")
        os.set_blocking(fd, True)
        return f.read(MAX_FILE_BYTES + 1)  # bounded: a file may still be huge (a sparse one)


_HUGE_INT_BITS = 1024
_HUGE_INT = ("holds an integer beyond the largest float (about 1.8e308), which no figure of a spec, plan or "
             "workload is: check the file")


def _has_huge_int(data: Any) -> bool:
    """Whether `data` holds an int past any float (YAML's hex and sexagesimal ints have no digit
    limit; float() and math.isfinite raise on them). Each list or dict once: YAML aliases share
    them, and a file of nested aliases expands to millions of items."""
    seen: set[int] = set()
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, int) and not isinstance(x, bool):
            if abs(x).bit_length() > _HUGE_INT_BITS:
                return True
        elif isinstance(x, (list, dict)) and id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.values() if isinstance(x, dict) else x)
            if isinstance(x, dict):
                stack.extend(x.keys())
    return False


class _DuplicateKey(ValueError):
    """A key given twice in one JSON object."""


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last
    one silently, so `tflops: 10, tflops: 500` made a 500 TFLOP/s device with no word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may override on purpose
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in first:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {shown(key)} (first at line "
                                                            f"{first[key] + 1}): give each key once",
                                                            key_node.start_mark)
                first[key] = key_node.start_mark.line
            except TypeError:  # an unhashable key: the base class names that
                continue
        return super().construct_mapping(node, deep)


def parse_json(text: Any, source: str, error: type[Exception]) -> Any:
    """JSON text (str or UTF-8 bytes) parsed as `read_structured` parses a JSON file: a syntax error,
    a key given twice, an integer past any float or brackets nested too deep are `error` in one line."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError:
            raise error(f"{source}: not UTF-8 text") from None
    if not isinstance(text, str):
        raise error(f"{source}: expected JSON text, got {type(text).__name__}")
    try:
        data = json.loads(text, object_pairs_hook=_unique_object)
    except json.JSONDecodeError as e:
        raise error(f"{source}: JSON syntax error at line {e.lineno} column {e.colno}: {e.msg}") from None
    except _DuplicateKey as e:
        raise error(f"{source}: duplicate key {shown(e.args[0])} in one object: give each key once") from None
    except ValueError as e:  # Python converts at most 4,300 digits to an int, by default
        if "integer string conversion" not in str(e):
            raise
        raise error(f"{source}: {_HUGE_INT}") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply to read (check the brackets)") from None
    if _has_huge_int(data):
        raise error(f"{source}: {_HUGE_INT}")
    return data


def _parse_text(p: Path, text: str, error: type[Exception]) -> Any:
    """JSON by suffix, YAML otherwise; a syntax error or a key given twice is `error` in one line."""
    if p.suffix.lower() == ".json":
        try:
            return parse_json(text, str(p), error)
        except error as e:  # "Expecting value" at line 1 named no fix for a YAML file saved as .json
            if not text.lstrip().startswith(("{", "[")) and isinstance(_yaml_or_none(text), dict):
                raise error(f"{e} (it is YAML, not JSON: name it .yaml, or write it as JSON)") from None
            raise
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if problem == "but found another document" and mark:  # PyYAML's words named neither cause nor fix
            raise error(f"{p}: holds more than one YAML document (a second begins with the '---' at line "
                        f"{mark.line + 1}): keep one per file") from None
        raise error(f"{p}: YAML syntax error{where}: {problem}") from None


def _yaml_or_none(text: str) -> Any:
    """`text` read as YAML, or None where it is not."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: a key twice, an int of 4,300+ digits
        return None


def write_text_atomic(path: str | Path, text: str, signals: tuple[int, ...] = (signal.SIGINT,)) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never half
    of it: a run following its cluster file (``run --adapt``) may read it at any moment, and
    Ctrl-C may come mid-write. Written beside it, then renamed over it.

    What the path names is written, not replaced: a device or a pipe (``-o /dev/null``,
    ``-o /dev/stdout``) gets the text written into it, since a rename would put a regular
    file in place of the device (and needs write access to /dev); a symlink keeps pointing
    at its target, and the target is the file renamed over. `signals` wait until the file is in
    place (`replace_file`)."""
    shown = str(path)
    path = Path(path)
    if path.is_dir():  # `-o .`: no name to write beside (and nothing to replace)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
    if path.exists() and not path.is_file():
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as e:
            raise type(e)(e.errno, e.strerror, shown) from None
        return
    target = Path(os.path.realpath(path))
    try:
        replace_file(target, lambda tmp: tmp.write_text(text), signals)
    except OSError as e:  # named by the file the user asked for, not the temporary one
        reason = e.strerror
        refused = cannot_write_in(target.parent) if target.parent.is_dir() else None
        if refused and not refused.startswith(DISK_FULL):
            # the temporary file's error: /proc's "No such file or directory" read as a missing file
            reason = f"cannot create a file in {target.parent} ({refused})"
        raise type(e)(e.errno, reason, shown) from None


def save_text(path: Any, text: str, error: type[Exception], what: str, example: str) -> None:
    """Write `text` to the file `path` as `write_text_atomic` does, for a call that saves a file
    (`Plan.save`, `Cluster.save`): a path it cannot write (None, a directory, a missing parent
    directory, one this user may not write in) is `error` in one line naming the path and the
    fix, where it was an OSError or a TypeError. `example`: a file name to suggest."""
    if not isinstance(path, str | os.PathLike):
        raise error(f"cannot save the {what}: expected the path of a file, got {shown(path)}; pass one such as "
                    f"{example}")
    p = Path(path)
    if not str(path).strip():  # Path("") is the current directory
        raise error(f"cannot save the {what}: the path is empty; pass a file path such as {example}")
    try:
        if p.is_dir():
            raise error(f"cannot save the {what} to {p}: it is a directory; pass the path of a file in it, such as "
                        f"{p / example}")
        if not p.parent.is_dir():
            if p.parent.exists():
                raise error(f"cannot save the {what} to {p}: {p.parent} is not a directory; pass a path in a "
                            "directory")
            raise error(f"cannot save the {what} to {p}: its directory {p.parent} does not exist; create it first, "
                        "or pass a path in an existing directory")
        if "\0" in str(path):
            raise ValueError
    except ValueError:  # a NUL in the path
        raise error(f"cannot save the {what} to {shown(str(path))}: not a valid path; pass a file path such as "
                    f"{example}") from None
    # /proc, a read-only mount, no permission: said as such (a write into /proc failed as a full disk).
    # A disk nearly full is tried: the file may fit, and if not it is DiskFull, a run's own failure
    reason = None if p.exists() and not p.is_file() else cannot_write_in(Path(os.path.realpath(p)).parent)
    if reason and not reason.startswith(DISK_FULL):
        raise error(f"cannot save the {what} to {p}: cannot create a file in {p.parent} ({reason}); pass a path in "
                    "a directory this user can write")
    try:
        write_text_atomic(p, text)
    except OSError as e:  # a full disk is DiskFull already
        raise error(f"cannot save the {what} to {p}: {e.strerror or e}; pass a path in a directory this user can "
                    "write") from None


def replace_file(path: Path, write: Callable[[Path], object], signals: tuple[int, ...] = (signal.SIGINT,)) -> None:
    """`write` a temporary file beside `path` (called with its path), then rename it over `path`:
    readers see the old file or the new one, and `signals` (Ctrl-C) wait until the new one is in
    place, then take effect."""
    from spantrain._interrupt import SignalsHeld

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Ctrl-C takes effect once the file is whole: `topo`, `plan` and the like quit on it with
    # os._exit (`spantrain._interrupt`), which runs no `finally`, and left the temporary file behind
    held = SignalsHeld(signals)
    with held:
        try:
            write(tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:  # torch.save says a full disk as "unexpected pos 828352 vs 828244"
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)  # first: what it held may be all the room there is
            full = _full_disk(path, e)
            if full is None:
                raise
            raise full from e
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    held.deliver()


def _full_disk(path: Path, error: BaseException):
    """A `DiskFull` naming `path` when `error` came of its disk being full, else None."""
    from spantrain.errors import DiskFull

    if isinstance(error, OSError) and error.errno is not None:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            return None  # it says its own cause (no permission, a read-only disk, /proc), not the disk's room
    elif free_if_full(path.parent) is None:  # torch.save's RuntimeError says no cause: the disk tells
        return None
    # no figure of the free space: the failed writer may still hold what it wrote
    return DiskFull(f"cannot write {path}: its disk is full; free some space (the file as it was before is kept)")


FULL_DISK_BYTES = 64 * 1024
"""Less free space than this on a directory's disk counts as full: a run's first records fill it."""
DISK_FULL = "its disk is full"
"""How `cannot_write_in` begins the reason for a full disk (a caller's fix differs)."""


def free_if_full(directory: str | Path) -> int | None:
    """The bytes free on `directory`'s disk when it counts as full (`FULL_DISK_BYTES`), else None
    (also when it cannot be asked, and for a file system of no size: /proc, /sys, which hold no
    files of ours and were said to be full)."""
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return None
    return usage.free if usage.total and usage.free < FULL_DISK_BYTES else None


def cannot_write_in(directory: str | Path) -> str | None:
    """Why this user cannot create a file in the existing `directory` (read-only, /proc, no
    permission), None when it can: tried with a temporary file, which the permission bits
    alone do not tell (root, read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        return str(e.strerror or e)
    # an empty file fits on a full disk: the run then failed at its first records, saying nothing
    if (free := free_if_full(directory)) is not None:
        return f"{DISK_FULL}: {free // 1024} KB free"
    return None


def cannot_create(path: str | Path) -> tuple[Path, str] | None:
    """Why the directory `path` could not be made and written, creating nothing: (the nearest
    directory above it that exists, or the file in its way; the reason), None when it could."""
    nearest = Path(os.path.abspath(path))
    while not nearest.exists():
        nearest = nearest.parent
    if not nearest.is_dir():
        return nearest, "Not a directory"
    reason = cannot_write_in(nearest)
    return (nearest, reason) if reason else None


def require_writable_dir(path: str | Path, option: str, error: type[Exception],
                         fix: str = "pass a directory this run can write", *, create: bool = True) -> None:
    """Create the directory `path` (with its parents) and check a file can be written in it,
    before any work: else `error` in one line naming `option` and `fix`. Without `create`, check
    it could be made and written, creating nothing (a later refusal leaves no empty directory)."""
    if not create:
        problem = cannot_create(path)
        if problem is not None:
            raise error(f"{option} {path} cannot be written ({problem[1]}): {fix}")
        return
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"{option} {path} cannot be written ({e.strerror or e}): {fix}") from None
    reason = cannot_write_in(path)
    if reason:
        raise error(f"{option} {path} cannot be written ({reason}): {fix}")


def check_keys(obj: dict, allowed: set[str], required: set[str], where: str, problems: list[str]) -> None:
    """Record unknown and missing keys of `obj`; an empty `where` leaves the messages unprefixed."""
    prefix = f"{where}: " if where else ""
    for key in obj:
        if key not in allowed:
            problems.append(f"{prefix}unknown key {shown(key)} (allowed: {', '.join(sorted(allowed))})")
    for key in sorted(required):
        if key not in obj:
            problems.append(f"{prefix}missing required key {shown(key)}")


# Each kind of file by the keys only it has (as a message names them, None when absent), and
# where it is passed.
_KINDS = {
    "cluster spec": (lambda d: "devices and network" if "devices" in d and "network" in d else None,
                     "pass it as the cluster (--cluster)"),
    "plan": (lambda d: "pipelines" if "pipelines" in d else None, "pass it as the plan (--plan, or plan --from)"),
    "workload file": (lambda d: _workload_keys(d), "pass it as the model (--model)"),
    "calibration profile": (lambda d: _calibration_keys(d), "pass it as the cost-model constants (--calibration)"),
}


def _workload_keys(spec: dict) -> str | None:
    """The workload keys `spec` has, if any: two of layers, global_batch and seq_len are enough, so a
    layers list that lacks its global_batch (a required key) is named as a workload file too."""
    if "architecture" in spec:
        return "architecture"
    own = [key for key in ("layers", "global_batch", "seq_len") if key in spec]
    return " and ".join(own[:2]) if len(own) >= 2 else None


def _calibration_keys(spec: dict) -> str | None:
    """The cost-model constants `spec` names (a calibration profile's keys), if any."""
    import dataclasses

    from spantrain.env.calibration import Calibration  # not at import: the cost model is heavier than this module

    raw = spec.get("calibration", spec)
    known = [k for k in raw if k in {f.name for f in dataclasses.fields(Calibration)}] if isinstance(raw, dict) else []
    return " and ".join(known[:2]) if known else None


def other_kind(spec: Any, kind: str) -> str | None:
    """The problem, unprefixed, when `spec`, read as a `kind` of file, has the keys of another kind:
    one line saying which, not a complaint per key (a cluster spec given as --model listed each key)."""
    if not isinstance(spec, dict) or (kind in _KINDS and _KINDS[kind][0](spec)):  # its own keys: its own problems
        return None
    for other, (keys_of, fix) in _KINDS.items():
        if other != kind and (keys := keys_of(spec)):
            return f"looks like a {other} (it has {keys}), not a {kind}: {fix}"
    return None


class _ShortRepr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        if abs(x).bit_length() > _HUGE_INT_BITS:  # repr itself refuses past 4,300 digits
            return f"<an integer of about {int(abs(x).bit_length() * math.log10(2))} digits>"
        return super().repr_int(x, level)


_SHOWN = _ShortRepr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother = 1, 80, 40, 80
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def shown(value: Any) -> str:
    """A value from a user's file as a message shows it: repr, cut short. A 490-byte YAML file
    of nested aliases expands to millions of items, and its full repr in a message took 7 MB
    (gigabytes and minutes, nested deeper); repr also keeps a newline in an id on one line."""
    return _SHOWN.repr(value)


def got(value: Any, whole: bool = False) -> str:
    """How a message shows a bad value: "got 'x'", saying so when a string holds a number. `whole`:
    for a whole-number field, a whole number written as text or with a fraction (YAML's 1e3 and
    1.0e+3, JSON's 64.0) is shown with the integer to write (the float form was hinted, then refused)."""
    quoted_int = isinstance(value, str) and value.strip().lstrip("+-").isdigit()  # '8': "without quotes" says it
    if whole and not quoted_int and isinstance(value, str | float) and len(str(value)) <= 80:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number) and number.is_integer() and 0 < number <= 2**53:
            return f"got {'the string ' if isinstance(value, str) else ''}{shown(value)} (write {int(number)})"
    if not isinstance(value, str):
        return f"got {shown(value)}"
    try:
        number = float(value)
    except ValueError:
        return f"got {shown(value)}"
    if not math.isfinite(number):
        return f"got {shown(value)}"
    m = _EXP_NUMBER.fullmatch(value.strip()) if len(value) <= 80 else None  # the hint quotes it whole
    if m and (m[2] or m[3]):
        sign, whole, frac, esign, exp = m.groups()
        fixed = f"{sign}{whole or '0'}.{frac or '0'}e{esign or '+'}{exp}"
        if fixed != value.strip().lower():
            return f"got the string {shown(value)} (YAML reads {value.strip()} as text; write {fixed})"
    return f"got the string {shown(value)} (write the number without quotes)"


def _is_number(value: Any) -> bool:
    # an int is finite (math.isfinite raises on one past the floats)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (isinstance(value, int)
                                                                               or math.isfinite(value))


def is_figure(value: Any, lo: float = 0.0) -> bool:
    """Whether `value` is a number (not a bool, not nan) from `lo` to FIGURE_MAX, the range of
    every figure of a spec: past FIGURE_MAX the cost model's sums overflow to inf."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= FIGURE_MAX


def positive_number(obj: dict, key: str, where: str, problems: list[str]) -> float | None:
    """The value of `obj[key]` if it is a finite number > 0, else record a problem."""
    if key not in obj:
        return None
    value = obj[key]
    if not _is_number(value) or value <= 0:
        problems.append(f"{where}: {key} must be a positive number, {got(value)}")
        return None
    if not FIGURE_MIN <= value <= FIGURE_MAX:
        problems.append(f"{where}: {key} must be from {FIGURE_MIN:g} to {FIGURE_MAX:g}, got {shown(value)}")
        return None
    return float(value)


def nonneg_number(obj: dict, key: str, where: str, problems: list[str]) -> float | None:
    if key not in obj:
        return None
    value = obj[key]
    if is_figure(value):
        return float(value)
    if _is_number(value) and value > FIGURE_MAX:
        problems.append(f"{where}: {key} must be at most {FIGURE_MAX:g}, got {shown(value)}")
    else:
        problems.append(f"{where}: {key} must be a number >= 0, {got(value)}")
    return None


def positive_int(obj: dict, key: str, where: str, problems: list[str]) -> int | None:
    if key not in obj:
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        problems.append(f"{where}: {key} must be a positive integer, {got(value, whole=True)}")
        return None
    return int(value)


def nonempty_str(obj: dict, key: str, where: str, problems: list[str]) -> str | None:
    if key not in obj:
        return None
    value = obj[key]
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        problems.append(f"{where}: {key} must be a non-empty string without spaces, got {shown(value)}")
        return None
    return value


def readable(x: float) -> str:
    """A figure as people read it: 2,400 and 1,283 whole, 0.0475 and 7.4e-05 to three digits,
    beyond a trillion 2e+21 (not twenty-two digits)."""
    return f"{x:,.0f}" if 100 <= abs(x) < 1e12 else f"{x:.3g}"


def plural(n: int, noun: str, many: str | None = None) -> str:
    """'1 device', '2 devices': a count with its noun, singular for exactly one."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def fmt_number(x: float) -> float | int:
    """A float in 9 significant digits when they hold it exactly (ints stay ints), so files stay
    readable; else the float itself, so a file read back holds the same number (a measured or
    changed figure lost its last digits in every save, and a saved cluster was not the one in memory)."""
    if float(x).is_integer():
        return int(x)
    short = float(f"{x:.9g}")
    return short if short == x else float(x)
