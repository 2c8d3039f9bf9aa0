"""nbval settings: compare stdout and results exactly, but not stderr (progress bars, kernel paths).

The kernels that nbval (and tests/chapter.py) start inherit BOOK_FIGURES: re-executed notebooks write
their figures to a scratch folder, not over the committed ones in figures/.
"""

import os
import sys
import tempfile

os.environ.setdefault("BOOK_FIGURES", tempfile.mkdtemp(prefix="book-figures-"))


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)


def pytest_terminal_summary(terminalreporter):
    """After `make guarantees`: the hardware matrix, one row per setting."""
    chapter = sys.modules.get("chapter")
    if not chapter or not chapter.RESULTS:
        return
    write = terminalreporter.write_line
    write("")
    write(f"{'setting':58} {'notebooks passed':>16} {'seconds':>8}")
    for setting in dict.fromkeys(s for s, *_ in chapter.RESULTS):
        rows = [r for r in chapter.RESULTS if r[0] == setting]
        passed, seconds = sum(r[2] for r in rows), sum(r[3] for r in rows)
        write(f"{setting:58} {f'{passed} of {len(rows)}':>16} {seconds:8.1f}")
