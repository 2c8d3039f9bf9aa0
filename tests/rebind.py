"""Run in a kernel before a notebook (tests/test_chapter.py): finds the cells that would read something
else if a reader re-ran them after Run All.

Before each cell runs, an IPython ``pre_run_cell`` hook notes the objects the cell reads at module level
(names loaded before the cell binds them; comprehension variables and function bodies excluded). After
Run All, ``rebound()`` lists each cell whose noted name now holds a different object, because a later
cell rebound it (9.2's ``T`` was 6 for the causal example and 5 after the multi-head listing: re-running
the example's figure cell after Run All drew a 5 x 5 mask beside 6 x 6 scores). Modules, and numbers,
strings and tuples rebound to an equal value, do not count.
"""

import ast
import itertools

from IPython import get_ipython

VALUES = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)
SEEN = []                      # (first line of the cell, {name: (id, value or None, is a module)})
DELETED = set()                # names some cell deleted with a del statement


def reads(source):
    """Names ``source`` reads at module level before binding them itself."""
    try:
        tree = ast.parse(source)
    except SyntaxError:        # IPython magics: nothing to note
        return set()
    events = []

    def visit(node, local=frozenset()):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            # the body runs later; what runs now: defaults, decorators, bases
            now = []
            if not isinstance(node, ast.ClassDef):
                now += [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
            if not isinstance(node, ast.Lambda):
                now += node.decorator_list + getattr(node, "bases", [])
                events.append((node.lineno, node.col_offset, "store", node.name))
            for n in now:
                visit(n, local)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            inner = set(local) | {t.id for g in node.generators for t in ast.walk(g.target) if isinstance(t, ast.Name)}
            for child in ast.iter_child_nodes(node):
                visit(child, frozenset(inner))
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            events.extend((node.lineno, node.col_offset, "store", (a.asname or a.name).split(".")[0]) for a in node.names)
            return
        if isinstance(node, ast.Name) and node.id not in local:
            events.append((node.lineno, node.col_offset, "load" if isinstance(node.ctx, ast.Load) else "store", node.id))
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(tree)
    first = {}
    for _, _, kind, name in sorted(events):
        first.setdefault(name, kind)
    return {name for name, kind in first.items() if kind == "load"}


def note(info):
    namespace = get_ipython().user_ns
    objects = {}
    for name in reads(info.raw_cell) & namespace.keys():
        value = namespace[name]
        objects[name] = (id(value), value if isinstance(value, VALUES) else None, type(value).__name__ == "module")
    first = next(itertools.chain((line for line in info.raw_cell.splitlines() if line.strip()), [""]))
    SEEN.append((first[:70], objects))
    # A name a cell deletes on purpose (`del model`, to free memory) makes an earlier cell that reads it raise
    # NameError if re-run: a plain error, not a silently different result, so it is not counted as rebound.
    try:
        tree = ast.parse(info.raw_cell)
    except SyntaxError:
        return
    DELETED.update(t.id for node in ast.walk(tree) if isinstance(node, ast.Delete)
                   for t in node.targets if isinstance(t, ast.Name))


def _same(a, b):
    """Whether ``a`` holds what ``b`` held: equal plain values, element by element in a tuple (whose
    elements may be tensors, which ``==`` would compare elementwise), the very object otherwise."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, VALUES):
        return a == b
    return a is b


def rebound():
    """``[(cell number, name, first line)]``: what a re-run after Run All would read rebound."""
    namespace = get_ipython().user_ns
    found = []
    for k, (first, objects) in enumerate(SEEN):
        for name, (ident, value, module) in sorted(objects.items()):
            now = namespace.get(name)
            if name not in namespace and name in DELETED:
                continue
            if module or id(now) == ident:
                continue
            if value is not None and _same(now, value):
                continue
            found.append((k, name, first))
    return found


get_ipython().events.register("pre_run_cell", note)
