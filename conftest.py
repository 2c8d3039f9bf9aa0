"""nbval settings: compare stdout and results exactly, but not stderr (progress bars, kernel paths).

The kernels that nbval (and tests/chapter.py) start inherit BOOK_FIGURES: re-executed notebooks write
their figures to a scratch folder, not over the committed ones in figures/.
"""

import os
import tempfile

os.environ.setdefault("BOOK_FIGURES", tempfile.mkdtemp(prefix="book-figures-"))


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)
