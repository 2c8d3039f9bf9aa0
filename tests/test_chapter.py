"""The book's guarantees, checked by executing the whole chapter again (slow: `make guarantees`).

- Determinism: every notebook, executed twice more in fresh kernels, once with one thread, prints
  exactly what its stored outputs (which nbval has just reproduced) say.
- Offline: every notebook executes with no network but loopback.
"""

import nbformat
import pytest
from chapter import NOTEBOOKS, comparable, execute, offline_prefix

pytestmark = pytest.mark.chapter
IDS = [p.stem for p in NOTEBOOKS]


def differences(a, b):
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x is not None and y is not None and x != y]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_same_outputs_on_two_threads_and_on_one(path):
    stored = comparable(nbformat.read(path, as_version=4))
    again = comparable(execute(path)[0])
    one_thread = comparable(execute(path, threads=1)[0])
    assert differences(stored, again) == [], "code cells whose outputs changed on re-execution"
    assert differences(stored, one_thread) == [], "code cells whose outputs change with one thread"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_offline(path):
    executed, _, _ = execute(path, offline=True)
    assert differences(comparable(nbformat.read(path, as_version=4)), comparable(executed)) == []


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
