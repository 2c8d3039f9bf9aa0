"""One source of truth for versions: pyproject.toml pins them; environment.yml only installs the project."""

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
ENV = yaml.safe_load((ROOT / "environment.yml").read_text())


def requirements():
    groups = PROJECT.get("optional-dependencies", {}).values()
    return [*PROJECT["dependencies"], *(r for group in groups for r in group)]


def test_every_dependency_is_pinned_exactly():
    loose = [r for r in requirements() if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][0-9a-z.]*", r)]
    assert not loose, f"pin these with ==: {loose}"


def test_torch_is_the_pinned_cpu_build():
    import torch

    assert "torch==2.13.0" in PROJECT["dependencies"]
    assert torch.__version__.split("+")[0] == "2.13.0" and torch.version.cuda is None


def test_environment_yml_installs_the_project_and_pins_nothing_else():
    conda = [d for d in ENV["dependencies"] if isinstance(d, str)]
    pip = [d["pip"] for d in ENV["dependencies"] if isinstance(d, dict)]
    assert sorted(conda) == ["pip", "python=3.11"], f"conda packages other than python and pip: {conda}"
    assert pip == [["-e ."]], f"environment.yml must install the project itself with pip, not {pip}"


def accepted():
    """The minor versions requires-python accepts: ">=3.11,<3.15" -> [11, 12, 13, 14]."""
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", PROJECT["requires-python"]).groups()
    return list(range(int(low), int(high)))


def test_python_versions_agree():
    """Binder and conda get the version CI tests (3.11); the Makefile looks for every accepted one."""
    python = next(d for d in ENV["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python == "python=3.11" and 11 in accepted()
    makefile = (ROOT / "Makefile").read_text()
    names = re.search(r"^PYTHONS\s*:= (.*)$", makefile, re.M)[1].split()
    assert names == [f"python3.{m}" for m in accepted()] + ["python3"]
    low, high = accepted()[0], accepted()[-1] + 1
    assert f"(3, {low}) <= sys.version_info < (3, {high})" in makefile


def fake_pythons(folder, **exits):
    """Stand-ins for interpreters on PATH: each answers the Makefile's version check with its exit code."""
    folder.mkdir()
    for name, code in exits.items():
        (folder / name.replace("_", ".")).write_text(f"#!/bin/sh\nexit {code}\n")
        (folder / name.replace("_", ".")).chmod(0o755)
    return str(folder)


def make_setup(path, venv, dry):
    make = shutil.which("make")
    return subprocess.run([make, "-C", ROOT, *(["-n"] if dry else []), "setup", f"VENV={venv}"],
                          env={"PATH": path}, capture_output=True, text=True)


def test_setup_picks_a_suitable_python_from_path(tmp_path):
    # python3.11 is a pyenv shim without its Python (exit 127), python3 too old (1), python3.13 suits (0).
    path = fake_pythons(tmp_path / "bin", python3_11=127, python3_13=0, python3=1)
    done = make_setup(path, tmp_path / "venv", dry=True)
    assert f"python3.13 -m venv {tmp_path / 'venv'}" in done.stdout, done.stdout + done.stderr


def test_setup_without_a_suitable_python_names_the_versions(tmp_path):
    path = fake_pythons(tmp_path / "bin", python3=1)
    done = make_setup(path, tmp_path / "venv", dry=False)
    assert done.returncode != 0 and not (tmp_path / "venv").exists()
    assert "needs Python 3.11, 3.12, 3.13 or 3.14 on PATH" in done.stderr
