"""One source of truth for versions: pyproject.toml pins them; environment.yml only installs the project."""

import re
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


def test_python_versions_agree():
    python = next(d for d in ENV["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert PROJECT["requires-python"] == ">=3.11,<3.12" and python == "python=3.11"
