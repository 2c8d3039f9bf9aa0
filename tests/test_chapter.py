"""The book's guarantees, checked by executing the whole chapter again (slow: `make guarantees`).

- Any machine: every notebook, executed under a simulated hardware matrix, prints exactly what its
  stored outputs (which nbval has just reproduced on this machine's own kernels) say. Each setting
  is covered once without multiplying them out: PyTorch's kernels forced to no vector extensions
  (`ATEN_CPU_CAPABILITY=default`) and to AVX2, MKL's vendor-neutral code path
  (`MKL_CBWR=COMPATIBLE`), this CPU's own kernels, one and two threads.
- Offline: every notebook executes with no network but loopback (the run on this CPU's own kernels).

The table of settings, notebooks passed and seconds is printed at the end of the run (conftest.py).
"""

import nbformat
import pytest
from chapter import NOTEBOOKS, RESULTS, comparable, execute, offline_prefix

pytestmark = pytest.mark.chapter

SETTINGS = {
    "ATEN_CPU_CAPABILITY=default, 1 thread": dict(variables={"ATEN_CPU_CAPABILITY": "default"}, threads=1),
    "ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=COMPATIBLE, 2 threads": dict(
        variables={"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}, threads=2),
    "this CPU's own kernels, offline": dict(offline=True),
}


def differences(a, b):
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x is not None and y is not None and x != y]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
@pytest.mark.parametrize("setting", SETTINGS)
def test_same_outputs_on_any_machine(setting, path):
    stored = nbformat.read(path, as_version=4)
    executed, seconds, _ = execute(path, **SETTINGS[setting])
    changed = differences(comparable(stored), comparable(executed))
    RESULTS.append((setting, path.stem, not changed, seconds))
    code = [c for c in stored.cells if c.cell_type == "code"]
    assert changed == [], f"code cells whose outputs differ under {setting}:\n" + "\n\n".join(
        code[i].source for i in changed)


def test_offline_means_no_network(tmp_path):
    """The offline mode really cuts the network: a connection to a public address fails."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=5)\n"
        "    print('connected')\n"
        "except OSError:\n"
        "    print('refused')"
    )])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    executed, _, _ = execute(path, offline=True)
    assert comparable(executed) == [["refused\n"]], f"unshare available: {offline_prefix() is not None}"
