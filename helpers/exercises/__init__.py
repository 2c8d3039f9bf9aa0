"""Checkers for the chapter's exercises: ``check("9.3.3", my_rope)``.

Importing the package in a notebook also registers the ``%%solution`` cell magic: a solution cell runs its
reference code in a copy of the notebook's names (``judge.run_solution``), so it never replaces the reader's
own function.

``judge`` is the checking machinery (what a check guarantees is listed in its docstring); ``s9_1`` ... ``s9_6``
and ``s9_a`` hold each section's checkers, in exercise order. Importing the package registers them all.
"""

from helpers.exercises import s9_1, s9_2, s9_3, s9_4, s9_5, s9_6, s9_a  # noqa: F401 (each registers its checkers)
from helpers.exercises.judge import (
    EXERCISES,
    TIME_LIMIT,
    Draw,
    Exercise,
    NotAttempted,
    Wrong,
    call,
    cases,
    check,
    close,
    compare,
    compare_number,
    exercise,
    fresh,
    run_solution,
    solved,
    verdict,
)

__all__ = ["EXERCISES", "TIME_LIMIT", "Draw", "Exercise", "NotAttempted", "Wrong", "call", "cases", "check", "close",
           "compare", "compare_number", "exercise", "fresh", "run_solution", "solved", "verdict"]


def _register_solution_magic():
    """``%%solution`` in a notebook: the cell runs through ``run_solution``, compiled as IPython compiles a cell
    (so that its functions have source, which the checker reads)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def solution(line, cell):
        code = shell.transform_cell(cell)
        run_solution(compile(code, shell.compile.cache(code), "exec"), shell.user_ns)

    shell.register_magic_function(solution, "cell", "solution")


_register_solution_magic()
