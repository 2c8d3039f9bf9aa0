"""Small matrices printed as tables, rounded to 2 decimals, the same on every machine.

The last digits of a computation carry round-off, so a value that lies on an edge of 2-decimal rounding (halfway
between two printed numbers, or a tiny number whose sign could flip) could print either way: ``show`` refuses it.
"""

import torch

from helpers import checks


def near_a_rounding_edge(*tables, within=1e-6):
    """The finite values of ``tables`` (tensors) that lie within ``within`` of an edge of 2-decimal rounding: a point
    halfway between two printed numbers (0.125, between 0.12 and 0.13), or 0, where a tiny number's sign could flip."""
    within = checks.positive_float(within, "within")
    if not tables:
        return []
    values = torch.cat([checks.tensor(t, "each table").detach().double().flatten() for t in tables])
    values = values[values.isfinite()]
    halfway = (values * 100 - 0.5 - (values * 100 - 0.5).round()).abs() / 100
    return values[(halfway < within) | ((values != 0) & (values.abs() < within))].tolist()


def show(title, values, rows, cols):
    """Print the matrix ``values`` (rows, cols) as a table, rounded to 2 decimals, its rows and columns labelled by
    ``rows`` and ``cols``. A value that round-off could print either way raises ValueError."""
    values = checks.tensor(values, "values")
    if values.dim() != 2:
        raise ValueError(f"values must be a matrix (rows, cols), got shape {tuple(values.shape)}")
    rows, cols = [str(r) for r in rows], [str(c) for c in cols]
    if (len(rows), len(cols)) != tuple(values.shape):
        raise ValueError(f"{len(rows)} row labels and {len(cols)} column labels for a matrix of shape "
                         f"{tuple(values.shape)}")
    if edge := near_a_rounding_edge(values):
        raise ValueError(f"{title}: {edge[0]!r} lies within 1e-6 of a rounding edge; round-off could print it either way")
    width = max(7, *(len(c) + 1 for c in cols)) if cols else 7
    print(title)
    print(" " * 8 + "".join(f"{c:>{width}}" for c in cols))
    for row, numbers in zip(rows, values.detach().double().tolist(), strict=True):
        print(f"{row:<8}" + "".join(f"{round(v, 2) + 0.0:{width}.2f}" for v in numbers))   # + 0.0: -0.0 to 0.0
