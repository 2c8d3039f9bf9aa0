"""nbval settings: compare stdout and results exactly, but not stderr (progress bars, kernel paths).

The kernels that nbval (and tests/chapter.py) start inherit BOOK_FIGURES: re-executed notebooks write
their figures to a scratch folder, not over the committed ones in figures/.
"""

import os
import shutil
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
