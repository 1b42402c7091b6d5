"""The package is what pyproject says it is, and the core stays light."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = {"spantrain": "spantrain", "profiler": "spantrain.profiler", "env": "spantrain.env",
             "policies": "spantrain.policies", "runtime": "spantrain.runtime", "experiments": "spantrain.experiments"}


DATA_FOLDERS = {"spantrain.env.profiles": "env/profiles", "spantrain.policies.assets": "policies/assets"}
"""Folders of data files, listed as packages so that setuptools installs them without warnings."""


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_and_mapped():
    setup = _pyproject()["tool"]["setuptools"]
    listed = set(setup["packages"])
    mapping = setup["package-dir"]
    on_disk = set()
    for folder, package in TOP_LEVEL.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts]) if rel.parts else package
            on_disk.add(name)
            assert Path(mapping[name]) == init.parent.relative_to(ROOT), f"{name} maps elsewhere"
    for name, folder in DATA_FOLDERS.items():  # no __init__.py: files the package reads
        assert (ROOT / folder).is_dir() and Path(mapping[name]) == Path(folder), f"{name} maps elsewhere"
        on_disk.add(name)
    assert listed == on_disk, f"listed but missing: {listed - on_disk}; on disk but unlisted: {on_disk - listed}"


def test_env_folder_is_not_ignored_by_git():
    # Common .gitignore templates drop `env/` as a virtualenv; ours must keep the subpackage.
    result = subprocess.run(["git", "check-ignore", "-q", "env/__init__.py"], cwd=ROOT)
    assert result.returncode == 1, "env/ is git-ignored"


def test_core_imports_no_heavy_frameworks():
    code = ("import sys, spantrain, spantrain.cluster, spantrain.workload, spantrain.plan, spantrain.estimate, "
            "spantrain.cli, spantrain.tracking;"
            "heavy = [m for m in ('torch', 'gymnasium', 'torch_geometric', 'stable_baselines3', 'wandb') "
            "if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_package_exports_load_on_first_use():
    """`import spantrain` loads nothing (the CLI's Ctrl-C handling comes first); every export still works."""
    code = ("import sys, spantrain; loaded = 'numpy' in sys.modules or 'spantrain.cluster' in sys.modules; "
            "missing = [n for n in spantrain.__all__ if getattr(spantrain, n, None) is None]; "
            "extra = sorted(set(spantrain._MODULE_OF) - set(spantrain.__all__)); "
            "print(loaded, missing, extra); sys.exit(1 if loaded or missing or extra else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_help_lists_every_design_command(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0
    for command in ("topo", "plan", "simulate", "compare", "train-policy", "profile", "emulate", "run"):
        assert command in out


def test_console_script_runs():
    result = subprocess.run([sys.executable, "-m", "spantrain", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("spantrain ")


@pytest.mark.slow
def test_regular_install_ships_a_loadable_policy_and_the_emulated_calibration(tmp_path):
    # an editable install reads files from the checkout, so only a real install shows
    # whether the wheel carries the shipped policy (it once did not: assets/ is no package)
    # from a copy: setuptools builds in the source tree, which must stay clean
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in TOP_LEVEL:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                            "--no-compile", "--target", str(site), str(src)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    # loading is what a fresh install can get wrong; planning with the policy is tested
    # on the checkout (here it would first recompile every numba kernel, ~30 s)
    code = ("import spantrain.policies.ppo as p, sys; assert p.__file__.startswith(sys.argv[1]), p.__file__;"
            "net, env, meta = p.load_policy(); assert meta['train_s'] > 0 and env['max_devices'] >= 16;"
            # the emulated runs' default calibration profile sits in a folder that is no package too
            "import spantrain.env.calibration as c; assert c.EMULATED_CPU.is_file() and "
            "c.EMULATED_CPU.is_relative_to(sys.argv[1]), c.EMULATED_CPU;"
            "assert c.Calibration.from_file(c.EMULATED_CPU).sync_overlap is False;"
            "print('ok')")
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
