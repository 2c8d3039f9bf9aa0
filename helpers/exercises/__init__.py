"""Checkers for the chapter's exercises: ``check("9.3.3", my_rope)``.

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
    solved,
    verdict,
)

__all__ = ["EXERCISES", "TIME_LIMIT", "Draw", "Exercise", "NotAttempted", "Wrong", "call", "cases", "check", "close",
           "compare", "compare_number", "exercise", "fresh", "solved", "verdict"]
