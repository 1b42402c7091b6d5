"""Experiment tracking with Weights & Biases, offline unless the user is logged in.

Every experiment script and long-running command logs through `Tracker`, so runs look
the same in W&B whatever produced them. wandb is imported lazily: the core stays light,
and `enabled=False` costs nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import netrc
import os
import shutil
import sys
from pathlib import Path
from typing import Any, TextIO

from spantrain._say import note
from spantrain.errors import SpantrainError

__all__ = ["Tracker", "check_environment", "check_can_track", "check_default_dir", "DEFAULT_DIR", "wandb_mode",
           "wandb_run_id", "WANDB_MODES", "INIT_TIMEOUT_S", "remove_import_temp_dirs", "RUN_ID_FILE", "RUN_DIR_FILE",
           "continued_run_id",
           "describe_run", "part_settings", "print_run_line"]

WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")
"""What `WANDB_MODE` may say (wandb's own list)."""

FLUSH_INTERVAL_S = 1.0
"""How often wandb writes what a run logged to its ``.wandb`` file. wandb's service dies with a
killed process (``kill -9``, the OOM killer) and loses what it had not written: at wandb's
default, 15 s or 32 KiB of records (a SIGKILLed train-policy's W&B run ended 500 PPO steps
before its saved state)."""

INIT_TIMEOUT_S = 30.0
"""How long an online run may take to start before the run goes offline instead (wandb
waits 90 s by default; `WANDB_INIT_TIMEOUT` overrides)."""


def wandb_mode() -> str:
    """`WANDB_MODE` if set, else online when an API key or a `wandb login` entry exists, else
    offline; `SpantrainError` for a `WANDB_MODE` wandb does not know."""
    if os.environ.get("WANDB_MODE"):
        mode = os.environ["WANDB_MODE"]
        if mode not in WANDB_MODES:
            raise SpantrainError(f"WANDB_MODE={mode} is not a W&B mode: set it to online, offline or disabled, "
                                 "or unset it")
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    return "online" if _netrc_login() else "offline"


def check_environment() -> str:
    """Refuse now, in one line naming it, a ``WANDB_*`` variable wandb would refuse when the run
    starts (there: a traceback, or a worker that fails after every other one started). An empty
    one counts as unset, as it does for wandb's own checks of `WANDB_MODE` here, but not in
    wandb itself, which refused ``WANDB_MODE=`` as a mode. Returns the mode (`wandb_mode`)."""
    for key in [k for k, v in os.environ.items() if k.startswith("WANDB_") and not v.strip()]:
        del os.environ[key]
    mode = wandb_mode()
    import wandb

    try:
        wandb.Settings().update_from_env_vars(dict(os.environ))
    except Exception as e:  # pydantic's ValidationError, wandb's UsageError: wandb's errors for its settings
        raise SpantrainError(_refused_setting(e)) from None
    _check_init_timeout()
    _check_directories()
    return mode


def _check_init_timeout() -> None:
    """wandb takes 0 or a negative timeout, then waits for ever for the run to start online."""
    value = os.environ.get("WANDB_INIT_TIMEOUT")
    if value is None:
        return
    with contextlib.suppress(ValueError):  # not a number: wandb's own check names it
        if not 0 < float(value) < math.inf:
            raise SpantrainError(f"WANDB_INIT_TIMEOUT={value} makes W&B wait for ever for a run to start: give a "
                                 "positive number of seconds, or unset it")


def _init_timeout() -> float:
    """`WANDB_INIT_TIMEOUT` as it is now, else `INIT_TIMEOUT_S`, passed to every `wandb.init`: wandb
    reads the variable once per process, so a change after an earlier run in the same process (a
    notebook, the test suite) went unheeded and it waited its 90 s."""
    with contextlib.suppress(ValueError, TypeError):
        value = float(os.environ.get("WANDB_INIT_TIMEOUT", ""))
        if 0 < value < math.inf:
            return value
    return INIT_TIMEOUT_S


_DIRECTORY_VARIABLES = ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR", "WANDB_CONFIG_DIR")


def _check_directories() -> None:
    """A W&B directory that cannot be written failed after the whole training (the final table's
    staging files), with a traceback."""
    from spantrain._spec import cannot_create

    for var in _DIRECTORY_VARIABLES:
        value = os.environ.get(var)
        problem = cannot_create(value) if value else None
        if problem is not None:
            raise SpantrainError(f"{var}={value}: W&B cannot write there ({problem[1]} at {problem[0]}): pass a "
                                 "directory this user can write, or unset it")


DEFAULT_DIR = "wandb-runs"
"""Where a `Tracker` given no `dir` keeps its files (in the working directory), unless `WANDB_DIR` is set."""


def check_can_track(fix: str = "pass --no-track") -> None:
    """Before a tracked job's work, what would stop its `Tracker` from starting at the end: a
    ``WANDB_*`` setting wandb refuses (`check_environment`) and a `DEFAULT_DIR` this user cannot
    make (`check_default_dir`; `fix` is the job's own way to go without tracking)."""
    check_environment()
    check_default_dir(fix)


def check_default_dir(fix: str) -> None:
    """Refuse now, in one line, a `DEFAULT_DIR` this user cannot make (a job run from a read-only
    directory): the `Tracker` made it only at the job's end, after all its work, with a traceback.
    `fix`: the job's own way to go without tracking (``pass --no-track``)."""
    from spantrain._spec import cannot_create

    if os.environ.get("WANDB_DIR"):  # checked by `check_environment`
        return
    problem = cannot_create(DEFAULT_DIR)
    if problem is not None:
        raise SpantrainError(f"W&B would keep its files in ./{DEFAULT_DIR}, which cannot be written ({problem[1]} at "
                             f"{problem[0]}): run from a directory this user can write, set WANDB_DIR to one, or "
                             f"{fix}")


def _refused_setting(e: Exception) -> str:
    """One line for a setting wandb refused, naming the variable it came from when it can."""
    errors = e.errors() if callable(getattr(e, "errors", None)) else []
    if errors:
        setting, reason = str(errors[0]["loc"][0]), errors[0]["msg"]
    else:
        reason = next((x.strip() for x in str(e).splitlines() if x.strip()), type(e).__name__)
        setting = "run_id" if reason.startswith("Run ID") else ""
    var = f"WANDB_{setting.upper()}"
    if setting and var in os.environ:
        return f"{var}={os.environ[var]} is refused by W&B ({reason}): fix it or unset it"
    return f"W&B refuses its settings from the environment ({reason}): fix or unset the WANDB_* variable concerned"


RUN_ID_FILE = "run-id"
"""In a tracker's directory: the id of the W&B run last logged there (`wandb_run_id`)."""


RUN_DIR_FILE = "run-dir"
"""Beside `RUN_ID_FILE`: the directory (absolute) the tracker wrote it in. A copied job directory
(``cp -r``) holds its original's, and a resumed job there logged into the original's W&B run."""


def wandb_run_id(dir: str | Path, *, resume: bool) -> str:
    """The W&B run a job logs to from `dir` (its tracker directory): `WANDB_RUN_ID` when set;
    with `resume`, the run last logged there, so a resumed job continues it (unless `dir` was
    copied or moved: `continued_run_id`); else a new id (W&B's form: 8 characters of [a-z0-9]),
    which every later launch of the job reuses."""
    import secrets
    import string

    if os.environ.get("WANDB_RUN_ID"):
        return os.environ["WANDB_RUN_ID"]
    path = Path(dir) / RUN_ID_FILE
    if resume:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            saved = path.read_text().strip()
            if saved and len(saved) <= 64 and saved.isalnum() and continued_run_id(dir, saved):
                return saved
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def continued_run_id(dir: str | Path, run_id: str | None) -> str | None:
    """`run_id`, the W&B run a resumed job's state names, or None (a new run) with a note when
    `dir` (the job's tracker directory) is not the directory that run was logged from: a copy
    (``cp -r R R2``) went on logging into R's run, two jobs in one. `WANDB_RUN_ID` wins, as
    everywhere; a directory with no record of its own (untracked so far) keeps `run_id`."""
    if os.environ.get("WANDB_RUN_ID"):
        return os.environ["WANDB_RUN_ID"]
    if not run_id:
        return run_id
    try:
        made_in = (Path(dir) / RUN_DIR_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return run_id
    if not made_in or made_in == str(Path(dir).resolve()):
        return run_id
    note(f"{dir} was copied or moved from {made_in}, whose W&B run {run_id} it would log into: logging to a new "
         f"W&B run instead (set WANDB_RUN_ID={run_id} to continue that one)")
    return None


def _netrc_login() -> bool:
    """Whether the .netrc file wandb reads (`NETRC`, else ~/.netrc) holds a `wandb login`
    entry: for W&B's API host (api.forge.coreweave.com, where `wandb login` writes it now, or
    api.wandb.ai) or the server `WANDB_BASE_URL` names."""
    from urllib.parse import urlsplit

    hosts = {"api.forge.coreweave.com", "api.wandb.ai"}
    if os.environ.get("WANDB_BASE_URL"):
        hosts.add(urlsplit(os.environ["WANDB_BASE_URL"]).netloc)
    path = os.environ.get("NETRC")
    try:
        rc = netrc.netrc(os.path.expanduser(path) if path else None)
    except (netrc.NetrcParseError, OSError):
        return False
    return any(rc.authenticators(host) for host in hosts if host)


class Tracker:
    """A thin wrapper over one W&B run: config, scalar metrics, tables, images and files."""

    def __init__(self, *, project: str = "spantrain", job_type: str, config: dict[str, Any] | None = None,
                 name: str | None = None, enabled: bool = True, dir: str | Path | None = None,
                 tags: list[str] | None = None, run_id: str | None = None):
        """`run_id`: continue that run (a resumed job): online, W&B appends to it; offline, a
        new directory holds this part under the same id, and `wandb sync` of every part
        uploads them into one run."""
        self.enabled = enabled
        self.run = None
        self._open_step: int | None = None
        self._floor = 0  # the first step earlier parts of this run did not log
        self._last = -1  # the last step this part logged
        self._steps_file: Path | None = None
        self._set_env: list[str] = []
        self.note: str | None = None
        """Why the run logs offline though online was asked for (also printed to stderr)."""
        if not enabled:
            return
        import wandb

        mode = check_environment()
        out = Path(dir or os.environ.get("WANDB_DIR", DEFAULT_DIR))
        out.mkdir(parents=True, exist_ok=True)
        # wandb stages a copy of every table and image it logs under WANDB_DATA_DIR (default
        # ~/.local/share/wandb) until it is uploaded, which offline is never unless synced: keep
        # them with the run's other files (until `finish`: wandb reads the variable when it logs)
        # and its service's debug logs under WANDB_CACHE_DIR (default ~/.cache/wandb), at every run
        for key, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache")):
            if key not in os.environ:
                os.environ[key] = str((out / sub).resolve())
                self._set_env.append(key)

        def init(mode: str, **settings: Any):
            return wandb.init(project=project, job_type=job_type, config=config or {}, name=name, mode=mode,
                              dir=str(out), tags=tags, reinit="finish_previous", id=run_id,
                              resume="allow" if run_id else None,
                              settings=wandb.Settings(silent=True, console="off", **_flush_setting(wandb),
                                                      **settings))

        if mode in ("offline", "disabled", "dryrun"):
            self.run = init(mode)
            self._follow_steps(out, name, config)
            return
        # online without a login, or without the network (wandb retried for 90 s, then
        # raised): the job logs offline instead, with a note, rather than failing
        timeout = {"init_timeout": _init_timeout()}
        _quiet_info(wandb)
        before = _run_dirs(out)
        try:
            self.run = init(mode, **timeout)
        except wandb.errors.Error as e:
            reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            # wandb's service keeps the failed online attempt's run id: an offline run under the
            # same id (a `run`'s, a resumed job's) was refused as "in use" and failed the job
            wandb.teardown()
            # the attempt's own directory: its log and a run record, which a later `wandb sync`
            # of the directory uploaded as an empty run beside the offline one
            for path in _run_dirs(out) - before:
                shutil.rmtree(path, ignore_errors=True)
            _quiet_info(wandb)  # the teardown took the setting with it
            self.run = init("offline")
            self.note = (f"W&B cannot log online ({reason[:200]}); logging offline to {self.url_or_dir} instead "
                         f"(`wandb sync {self.url_or_dir}` uploads it later)")
            note(self.note)
        self._follow_steps(out, name, config)

    def _follow_steps(self, out: Path, name: str | None, config: dict[str, Any] | None) -> None:
        """W&B keeps a run's steps increasing: each part of a run notes the last step it logged
        (`out`/last-step-ID), and a part that continues the run starts past it. The part's name and
        config are noted too (`out`/part-ID.json), for a later part that has neither (`part_settings`)."""
        if self.run is None or getattr(self.run, "disabled", False):
            return
        with contextlib.suppress(OSError):  # what a resumed job continues (`wandb_run_id`)
            (out / RUN_ID_FILE).write_text(self.run.id)
            (out / RUN_DIR_FILE).write_text(str(out.resolve()))
        if name or config:
            with contextlib.suppress(OSError, TypeError, ValueError):  # a cut file is read as none
                (out / f"part-{self.run.id}.json").write_text(json.dumps({"name": name, "config": config or {}},
                                                                         default=str))
        self._steps_file = out / f"last-step-{self.run.id}"
        with contextlib.suppress(OSError, ValueError):
            self._floor = int(self._steps_file.read_text()) + 1

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Scalars at `step`. A part that continues a run (`run_id`) logs a step its run already
        has (a rollout trained again after a resume) at the first one it has not: W&B would
        drop the row."""
        if self.run is not None:
            step = self._at(step)
            self.run.log(metrics, step=step)
            # with a step, wandb holds the row open until a later step (or the run's end) commits it
            self._open_step = step

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int | None = None) -> None:
        """A table, at `step` when given (as `log`): a resumed run's history starts past 0, and a
        row logged below it is dropped when the run's parts are synced."""
        if self.run is not None:
            import wandb

            self.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

    def log_image(self, key: str, path: str | Path, step: int | None = None) -> None:
        """An image file, at `step` when given (as `log`)."""
        if self.run is not None and Path(path).exists():
            import wandb

            self.log({key: wandb.Image(str(path))}, step=step)

    def _at(self, step: int | None) -> int | None:
        """`step`, raised to the first step this run has not logged and to the last step this
        part logged (W&B drops a row below it: train-policy's final table and curve, after
        PPO's last losses one step on); the highest kept for the next part."""
        if step is None:
            return None
        step = max(step, self._floor, self._last)
        if step > self._last:
            self._last = step
            if self._steps_file is not None:
                # at every new step, not at the end: a killed part must not make the next one log below it
                with contextlib.suppress(OSError):
                    self._steps_file.write_text(str(step))
        return step

    def log_artifact(self, path: str | Path, *, name: str, type: str, aliases: list[str],
                     metadata: dict[str, Any] | None = None, copy: bool = False) -> None:
        """Version a file in W&B (a policy checkpoint, say) under `name`, tagged with `aliases`.

        The file is referenced, not copied, so it must stay as it is until the run is uploaded
        (online: at the run's end; offline: `wandb sync`). `copy`: a file that will be
        rewritten (a run's final policy, which its resumed part rewrites) is copied instead, to
        the run's staging directory (``WANDB_DATA_DIR``, which the tracker keeps with the run)."""
        if self.run is not None and not getattr(self.run, "disabled", False):
            import wandb

            artifact = wandb.Artifact(name, type=type, metadata=metadata)
            # absolute: the run's record keeps the path, and `wandb sync` may run from another directory
            artifact.add_file(str(Path(path).resolve()), policy="mutable" if copy else "immutable")
            self.run.log_artifact(artifact, aliases=aliases)

    def summary(self, values: dict[str, Any]) -> None:
        """Set the run's summary values. A row still open is committed first: at the run's end it
        would otherwise overwrite keys it shares (a run's median ``samples_per_s`` by the last
        iteration's)."""
        if self.run is not None:
            if self._open_step is not None:
                self.run.log({}, step=self._open_step, commit=True)
                self._open_step = None
            self.run.summary.update(values)

    @property
    def run_id(self) -> str | None:
        """The W&B run's id (what `run_id` takes to continue it); None untracked or disabled."""
        if self.run is None or getattr(self.run, "disabled", False):
            return None
        return self.run.id

    @property
    def url_or_dir(self) -> str:
        """Where the run is: its W&B page, or offline its directory (what `wandb sync` takes);
        "" untracked or with `WANDB_MODE=disabled`."""
        if self.run is None or getattr(self.run, "disabled", False):
            return ""
        if getattr(self.run, "offline", False):
            return str(Path(self.run.dir).parent)
        return self.run.url or str(Path(self.run.dir).parent)

    def finish(self, exit_code: int | None = None) -> None:
        """End the W&B run (`exit_code` nonzero marks it failed) and restore the environment."""
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
        for key in self._set_env:
            os.environ.pop(key, None)
        self._set_env = []

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        self.finish(exit_code=None if exc_type is None else 1)


def part_settings(dir: str | Path, run_id: str | None) -> dict[str, Any]:
    """The name and config the last part of run `run_id` logged from `dir` (a tracker's directory)
    started with, as `Tracker`'s keyword arguments: a later part of the same run that has neither
    of its own (`run --adapt`'s decisions, logged by the launcher) starts with the same ones, not
    with an empty name and config. {} when there is none."""
    if not run_id:
        return {}
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads((Path(dir) / f"part-{run_id}.json").read_text())
        if isinstance(saved, dict):
            return {"name": saved.get("name") or None, "config": saved.get("config") or None}
    return {}


def _quiet_info(wandb) -> None:
    """wandb's info lines off in this process, its warnings and errors kept: an online run's login
    printed ``wandb: [wandb.login()] Loaded credentials for HOST from WANDB_API_KEY.`` to stderr (a
    run's own `silent` setting comes too late for it). wandb sets its terminal output up from its
    process-wide settings when it first makes them (`wandb.setup`), so they are set up again here
    for a process where that was done before. Where this wandb has no `show_info`, nothing changes."""
    if not _has_setting(wandb, "show_info"):
        return
    with contextlib.suppress(Exception):  # a nicety: an online run must not fail over it
        setup = wandb.setup(wandb.Settings(show_info=False))
        wandb.termsetup(setup.settings, None)


def _has_setting(wandb, name: str) -> bool:
    """Whether this wandb's Settings take `name` (they refuse names they do not know, and some of
    ours came after 0.18, the oldest release spantrain takes)."""
    return name in getattr(wandb.Settings, "model_fields", {})


def _flush_setting(wandb) -> dict[str, float]:
    """`FLUSH_INTERVAL_S` as wandb's setting, where this wandb has it (an internal one)."""
    name = "x_transaction_log_flush_interval"
    return {name: FLUSH_INTERVAL_S} if _has_setting(wandb, name) else {}


def _run_dirs(out: Path) -> set[Path]:
    """The online runs' directories wandb made under `out` (``wandb/run-DATE-ID``)."""
    return set((out / "wandb").glob("run-*-*"))


def describe_run(where: str) -> str:
    """`where` (a run's W&B page, or offline its directory) for a closing line. Offline, a job that
    several launches logged to (a `--resume`, `--adapt`'s plans, its decisions table) has a
    directory per launch under one run id: naming the last alone, `wandb sync` of it uploaded that
    launch's part only. Then the line says so and gives the pattern that uploads every part."""
    path = Path(where)
    if not path.name.startswith("offline-run-"):
        return where
    run_id = path.name.rsplit("-", 1)[-1]
    parts = sorted(path.parent.glob(f"offline-run-*-{run_id}"))
    if len(parts) <= 1:
        return f"{where} (offline: `wandb sync {where}` uploads it)"
    return (f"{where} (one of {len(parts)} offline parts of run {run_id}, one per launch: "
            f"`wandb sync {path.parent}/offline-run-*-{run_id}` uploads them all)")


def print_run_line(where: str, *, file: TextIO | None = None) -> None:
    """The line naming a job's W&B run, ``W&B run: ...`` (`describe_run`), that every tracked
    command and experiment script prints as it ends; nothing when it was not tracked."""
    if where:
        print(f"W&B run: {describe_run(where)}", file=file or sys.stdout)


def remove_import_temp_dirs() -> None:
    """Remove the temporary directories wandb makes when it is imported (for media and
    artifacts), in a process about to end by `os._exit`: their removal is an exit handler,
    which that skips, so every tracked `spantrain run` left two empty directories in $TMPDIR.
    Nothing when wandb was never imported; wandb cannot log media in this process afterwards."""
    import tempfile

    for module, attrs in (("wandb.sdk.data_types._private", ("MEDIA_TMP",)),
                          ("wandb.sdk.artifacts.artifact", ("Artifact", "_TMP_DIR"))):
        found: Any = sys.modules.get(module)
        for attr in attrs:
            found = getattr(found, attr, None)
        if isinstance(found, tempfile.TemporaryDirectory):
            found.cleanup()
