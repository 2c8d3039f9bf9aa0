"""Execution report: each notebook in a fresh kernel, its seconds and peak memory, against the budgets
in tests/budgets.toml, and each notebook's slowest cells, so the next cost is visible. A benchmark that
reports; it does not fail on a slow machine (`make bench`). It times a reader's Run All, in which a
control draws only its start state and no figure is written (`make execute` does both for the book).

Memory: the peak of the kernel's process tree (its own and the processes it starts, 9.4's race workers),
each page counted once, as a memory limit counts it (PSS, ``chapter.tree_memory``); beside it the peak of
their resident sizes added up, which counts the pages they share once per process.

The cells' times come from the timestamps nbclient records in every executed cell
(``metadata.execution``: from ``iopub.status.busy`` to ``shell.execute_reply``), which `make execute`
strips from the stored notebooks (book/clean.py) but this report reads from its own fresh run.
"""

import sys
import tempfile
import tomllib
from datetime import datetime
from pathlib import Path

import nbformat
from chapter import execute
from paths import NOTEBOOKS, ROOT, source

BUDGETS = tomllib.loads((ROOT / "tests" / "budgets.toml").read_text())
SLOWEST = 3                                                     # cells listed per notebook
# A reader's Run All: each control draws its start state alone (helpers.controls.every_state) and the
# figures are shown, not written (helpers.plotting.figures_dir). `make execute`, the book's build, also
# draws every other state for the site and writes every figure to figures/.
READER = {"BOOK_FRAMES": "", "BOOK_FIGURES": ""}


def startup_cost(times=3):
    """Seconds to start a kernel and import torch and helpers, the floor under every notebook: the run
    with the median seconds of ``times`` (one kernel start varied from 2.0 to 3.4 s here, and the
    chapter's budget is a multiple of it)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch\nimport helpers")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "startup.ipynb"
        nbformat.write(nb, path)
        runs = sorted((execute(path) for _ in range(times)), key=lambda run: run.seconds)
        return runs[len(runs) // 2][:4]                  # (notebook, seconds, MiB, after), as conftest.py unpacks it


def cell_seconds(nb):
    """``[(seconds, index, first line)]`` of every executed code cell, slowest first (index: among code cells)."""
    timed = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        stamps = cell.metadata.get("execution", {})
        if "iopub.status.busy" in stamps and "shell.execute_reply" in stamps:
            start, end = (datetime.fromisoformat(stamps[k].replace("Z", "+00:00"))
                          for k in ("iopub.status.busy", "shell.execute_reply"))
            first = next((line for line in cell.source.splitlines() if line.strip() and not line.startswith(("#", "@"))), "")
            timed.append(((end - start).total_seconds(), i, first))
    return sorted(timed, reverse=True)


def summary(stem, run):
    """What the report shows of one execution: ``(stem, seconds, peak MiB, slowest cells, peak RSS sum MiB)``,
    plain data (pytest-xdist carries it from a worker to the report)."""
    return stem, run.seconds, run.mib, cell_seconds(run.nb)[:SLOWEST], run.rss_mib


def report(rows, floor, mib_floor=None, write=print):
    """The execution report: ``rows`` from ``summary``, in the chapter's order; ``floor`` the kernel-start cost."""
    if mib_floor is not None:
        write(f"kernel start + import torch, helpers (median of 3): {floor:.1f} s, {mib_floor:.0f} MiB")
    write("")
    write(f"{'notebook':34} {'seconds':>8} {'budget':>7} {'peak MiB':>9} {'budget':>7} {'RSS sum':>8}  within")
    total = 0.0
    for stem, seconds, mib, _, *rss in rows:
        budget = BUDGETS["race"] if stem == BUDGETS["race_notebook"] else BUDGETS["notebook"]
        total += seconds
        over = [what for what, bad in (("time", seconds > budget), ("memory", mib > BUDGETS["memory"])) if bad]
        write(f"{stem:34} {seconds:8.1f} {budget:7.0f} {mib:9.0f} {BUDGETS['memory']:7.0f} {rss[0] if rss else 0:8.0f}  "
              f"{'NO: ' + ', '.join(over) if over else 'yes'}")
    within = "yes" if total <= BUDGETS["chapter"] else "NO"
    write(f"{'total':34} {total:8.1f} {BUDGETS['chapter']:7.0f} {'':9} {'':7} {'':8}  {within}")
    write(f"{'':34} {total / floor:7.0f}x the kernel-start floor of {floor:.1f} s (budget {BUDGETS['floors']}x)")
    write("")
    write("slowest cells (code cell number: its first line):")
    for stem, _, _, slowest, *_ in rows:
        write(f"  {stem}")
        for s, i, first in slowest:
            write(f"    {s:6.1f} s  cell {i:2d}: {first[:70]}")


def main(paths):
    _, floor, mib, _ = startup_cost()
    runs = []
    for path in paths:
        runs.append(summary(path.stem, execute(path, variables=READER)))
        print(f"  {path.stem} done", flush=True)
    report(runs, floor, mib)


if __name__ == "__main__":
    main([source(p).with_suffix(".ipynb") for p in sys.argv[1:]] or NOTEBOOKS)
