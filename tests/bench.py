"""Execution report: each notebook in a fresh kernel, its seconds and peak memory, against the budgets
in tests/budgets.toml. A benchmark that reports; it does not fail on a slow machine (`make bench`)."""

import sys
import tempfile
import tomllib
from pathlib import Path

import nbformat
from chapter import NOTEBOOKS, ROOT, execute

BUDGETS = tomllib.loads((ROOT / "tests" / "budgets.toml").read_text())


def startup_cost():
    """Seconds to start a kernel and import torch and helpers: the floor under every notebook."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch\nimport helpers")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "startup.ipynb"
        nbformat.write(nb, path)
        return execute(path)


def main(paths):
    _, seconds, mib = startup_cost()
    print(f"kernel start + import torch, helpers: {seconds:.1f} s, {mib:.0f} MiB\n")
    print(f"{'notebook':34} {'seconds':>8} {'peak MiB':>9} {'budget':>7}  within")
    total = 0.0
    for path in paths:
        budget = BUDGETS["race"] if path.stem == BUDGETS["race_notebook"] else BUDGETS["notebook"]
        _, seconds, mib = execute(path)
        total += seconds
        print(f"{path.stem:34} {seconds:8.1f} {mib:9.0f} {budget:7.0f}  {'yes' if seconds <= budget else 'NO'}", flush=True)
    print(f"{'total':34} {total:8.1f} {'':9} {BUDGETS['chapter']:7.0f}  {'yes' if total <= BUDGETS['chapter'] else 'NO'}")


if __name__ == "__main__":
    main([Path(p).with_suffix(".ipynb") for p in sys.argv[1:]] or NOTEBOOKS)
