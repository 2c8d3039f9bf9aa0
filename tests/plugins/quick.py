"""A pytest plugin that `make check` loads first (-p quick): two costs its edit loop paid at every run for nothing.

- nbval imports nbformat, nbformat imports jsonschema, and jsonschema checks the "iri" string format with
  rfc3987_syntax where that package is installed (jupyter-events brings it, for JupyterLab). Its import compiles three
  Earley grammars: 1.1 s in pytest's controller, and again in each worker. No notebook schema uses the format, so the
  import is refused here, and jsonschema goes on without that one checker, as where the package is not installed.
- At its end each worker ran full garbage collections over every object that torch, matplotlib and the test modules
  made at import (pytest's unraisable-exception plugin runs five; Python's exit one more): 1.2 s. Those objects live
  to the end anyway, so once collected they are frozen (gc.freeze), and the collections scan only what the tests made.
"""

import gc
import sys

sys.modules.setdefault("rfc3987_syntax", None)      # None in sys.modules: `import rfc3987_syntax` raises ImportError


def pytest_collection_finish(session):
    gc.freeze()
