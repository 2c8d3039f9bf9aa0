"""nbval settings: compare stdout and results exactly, but not stderr (progress bars, kernel paths).

The kernels that nbval (and tests/chapter.py) start inherit BOOK_FIGURES: re-executed notebooks write
their figures to a scratch folder, not over the committed ones in figures/.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_scratch = None


def pytest_configure(config):
    """Send figures to a scratch folder unless BOOK_FIGURES is set: to a folder, or empty for a reader's run, which
    writes none (make check); made only when needed."""
    global _scratch
    if "BOOK_FIGURES" not in os.environ:
        _scratch = tempfile.mkdtemp(prefix="book-figures-")
        os.environ["BOOK_FIGURES"] = _scratch


def pytest_unconfigure(config):
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)
        os.environ.pop("BOOK_FIGURES", None)


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)


@pytest.hookimpl(tryfirst=True)     # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """A notebook's cells run in order in one kernel: under `--dist loadgroup` (make check) they form one group, on
    one worker, while the unit tests are shared out one by one between the workers."""
    for item in items:
        if item.fspath.ext == ".ipynb":
            item.add_marker(pytest.mark.xdist_group(item.fspath.purebasename))


def pytest_terminal_summary(terminalreporter):
    """After `make guarantees`: the hardware matrix, one row per setting, and the execution report of
    the run on this CPU's own kernels (what `make bench` prints, from a run CI makes anyway). The rows come
    from the tests' recorded properties, which pytest-xdist carries back from its workers."""
    readable = [dict(r.user_properties)["readability"] for key in ("passed", "failed")
                for r in terminalreporter.stats.get(key, []) if r.when == "call" and "readability" in dict(r.user_properties)]
    if readable:
        sys.path.insert(0, str(Path(__file__).parent / "tests"))
        import readability
        terminalreporter.write_line("")
        terminalreporter.write_line("readability (tests/readability.py: python tests/readability.py lists every problem)")
        readability.table(sorted(readable, key=lambda r: r["section"]), write=terminalreporter.write_line)
    runs = [dict(r.user_properties)["chapter_run"] for key in ("passed", "failed")
            for r in terminalreporter.stats.get(key, []) if r.when == "call" and "chapter_run" in dict(r.user_properties)]
    if not runs:
        return
    write = terminalreporter.write_line
    write("")
    write(f"{'setting':58} {'notebooks passed':>16} {'seconds':>8}")
    for setting in dict.fromkeys(r["setting"] for r in runs):
        rows = [r for r in runs if r["setting"] == setting]
        passed, seconds = sum(r["passed"] for r in rows), sum(r["row"][1] for r in rows)
        write(f"{setting:58} {f'{passed} of {len(rows)}':>16} {seconds:8.1f}")
    sys.path.insert(0, str(Path(__file__).parent / "tests"))     # the controller of pytest-xdist collects nothing
    import bench
    own = sorted((r["row"] for r in runs if r["setting"].startswith("this CPU's own")), key=lambda row: row[0])
    if len(own) == len(bench.NOTEBOOKS):
        _, floor, mib, _ = bench.startup_cost()
        write("")
        write("execution report (make bench's), from the run on this CPU's own kernels: two notebooks at a time, and"
              " every control drawing every state (BOOK_FRAMES=all, as make execute; make bench times a reader's run)")
        bench.report(own, floor, mib, write=write)
