"""Outside a checkout (Colab, a downloaded notebook) a notebook runs or says exactly what to do.

A copy of a notebook runs in an empty folder, in a kernel that has the pinned packages but not the
book's own: a throwaway venv whose site-packages holds a .pth line naming this environment's
site-packages. The .pth files inside a folder added that way are not processed, so the editable install
of `helpers` stays invisible, as on Colab. No network is used: the address is empty, local, or served
by a stand-in for pip. The first two tests stop at the first cell; the third runs the whole notebook,
so it is marked `chapter` and runs with `make guarantees`.
"""

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from chapter import comparable
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "9.6-images-and-other-data.ipynb"
RECORDED = '    REPOSITORY = ""'

# Stands in for `python -m pip` in the throwaway venv: records its arguments and "installs" the
# helpers by copying them from this checkout, as a non-editable install would.
FAKE_PIP = """
import shutil, sys
from pathlib import Path
Path({log!r}).write_text(" ".join(sys.argv[1:]))
shutil.copytree({helpers!r}, Path(__file__).resolve().parents[1] / "helpers")
"""


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """An empty folder and the name of a kernel without the book's package; returns (folder, venv's site-packages)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.check_output([python, "-c", where], text=True).strip())
    (site / "pinned.pth").write_text(sysconfig.get_path("purelib") + "\n")
    spec = tmp_path / "jupyter" / "kernels" / "outside"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "outside", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for name in ("PYTHONPATH", "BOOK_FIGURES"):
        monkeypatch.delenv(name, raising=False)
    # Belt and braces for "no network": pip may not reach an index, git may clone only local paths.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "file")
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder, site


def run_copy(folder, repository=""):
    """Copy the notebook into ``folder`` with ``repository`` as its recorded address and execute it there."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        cell.outputs, cell.execution_count = [], None
    first = code[0]
    assert RECORDED in first.source
    first.source = first.source.replace(RECORDED, f'    REPOSITORY = "{repository}"')
    nbformat.write(nb, folder / NOTEBOOK.name)
    client = NotebookClient(nb, timeout=300, kernel_name="outside", resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()
    except CellExecutionError:
        pass
    return nb


def stop_message(nb):
    """The error the notebook stopped with, checking that it stopped at its first code cell."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for o in code[0].outputs if o.output_type == "error"]
    assert errors, f"the first cell did not stop the notebook: {code[0].outputs}"
    assert all(not c.outputs for c in code[1:]), "cells after the first ran"
    return errors[0].ename, errors[0].evalue


def test_no_address_recorded_says_what_to_run(outside):
    folder, _ = outside
    ename, message = stop_message(run_copy(folder))
    assert ename == "SystemExit", f"stopped with {ename}: {message}"
    assert message.startswith("This notebook needs the book's `helpers` package. Clone the book's repository")
    assert "`make book`" in message and "pip install" not in message


def test_unreachable_address_says_what_to_run(outside):
    folder, _ = outside
    url = "file:///nonexistent/attention-chapter"
    ename, message = stop_message(run_copy(folder, url))
    assert ename == "SystemExit", f"stopped with {ename}: {message}"
    assert f'`pip install "attention-chapter @ git+{url}"`' in message and "`make book`" in message


@pytest.mark.chapter  # executes the whole notebook: run by `make guarantees`, with the chapter
def test_recorded_address_installs_the_helpers_and_the_notebook_runs(outside, tmp_path):
    folder, site = outside
    log = tmp_path / "pip-args"
    (site / "pip").mkdir()
    (site / "pip" / "__init__.py").write_text("")
    (site / "pip" / "__main__.py").write_text(FAKE_PIP.format(log=str(log), helpers=str(ROOT / "helpers")))
    figures = {p.name: p.stat().st_mtime_ns for p in (ROOT / "figures").iterdir()}
    nb = run_copy(folder, "https://example.org/attention-chapter")
    assert log.read_text() == "install --quiet --no-deps git+https://example.org/attention-chapter"
    errors = [f"{o.ename}: {o.evalue}" for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == [], "the notebook stopped"
    stored = comparable(nbformat.read(NOTEBOOK, as_version=4))
    assert comparable(nb) == stored, "outside a checkout the notebook prints something else"
    # The figures were shown, not written: nothing in the folder, nothing in the checkout's figures/.
    assert sorted(p.name for p in folder.iterdir()) == [NOTEBOOK.name]
    assert {p.name: p.stat().st_mtime_ns for p in (ROOT / "figures").iterdir()} == figures
