"""nbval settings: compare stdout and results exactly, but not stderr (progress bars, kernel paths).

The kernels that nbval (and tests/chapter.py) start inherit BOOK_FIGURES: re-executed notebooks write
their figures to a scratch folder, not over the committed ones in figures/.
"""

import os
import shutil
import sys
import tempfile

_scratch = None


def pytest_configure(config):
    """Send figures to a scratch folder unless BOOK_FIGURES names one already; made only when needed."""
    global _scratch
    if not os.environ.get("BOOK_FIGURES"):
        _scratch = tempfile.mkdtemp(prefix="book-figures-")
        os.environ["BOOK_FIGURES"] = _scratch


def pytest_unconfigure(config):
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)
        os.environ.pop("BOOK_FIGURES", None)


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)


def pytest_terminal_summary(terminalreporter):
    """After `make guarantees`: the hardware matrix, one row per setting, and the execution report of
    the run on this CPU's own kernels (what `make bench` prints, from a run CI makes anyway)."""
    chapter = sys.modules.get("chapter")
    if not chapter or not chapter.RESULTS:
        return
    write = terminalreporter.write_line
    write("")
    write(f"{'setting':58} {'notebooks passed':>16} {'seconds':>8}")
    for setting in dict.fromkeys(s for s, *_ in chapter.RESULTS):
        rows = [r for r in chapter.RESULTS if r[0] == setting]
        passed, seconds = sum(r[2] for r in rows), sum(r[3].seconds for r in rows)
        write(f"{setting:58} {f'{passed} of {len(rows)}':>16} {seconds:8.1f}")
    own = [(stem, run) for setting, stem, _, run in chapter.RESULTS if setting.startswith("this CPU's own")]
    if len(own) == len(chapter.NOTEBOOKS):
        import bench
        _, floor, mib, _ = bench.startup_cost()
        write("")
        write("execution report (make bench), from the run on this CPU's own kernels:")
        bench.report(own, floor, mib, write=write)
