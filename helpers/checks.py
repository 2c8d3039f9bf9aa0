"""Argument checks shared by the helpers: each is one line at the call site and says the same thing
for the same mistake everywhere.

Every check raises ``ValueError`` naming the argument, what it must be and what it got, and returns
the value (converted where that is safe: a NumPy integer becomes an ``int``), so that a call reads
``T = positive_int(T, "T")``.
"""

import math
import numbers

import numpy as np
import torch


def integer(value, name):
    """An ``int`` (or a NumPy integer), never a bool or a float, even a whole one: ``4.0`` hides a bug."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return int(value)


def positive_int(value, name):
    """An integer ``>= 1``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def non_negative_int(value, name):
    """An integer ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def _finite(value):
    """``value`` as a finite ``float``, or None: a bool, a non-real, NaN, infinity, or an int too large for a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        value = float(value)
    except OverflowError:                       # 10**400: a real number, but no float holds it
        return None
    return value if math.isfinite(value) else None


def _shown(value):
    """``value``'s repr, shortened for an int of hundreds of digits."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= 10 ** 30:
        return f"an integer of {len(str(abs(int(value))))} digits, too large for a float"
    return repr(value)


def finite_float(value, name):
    """A real number that is neither NaN nor infinite (a bool is refused), as a ``float``."""
    converted = _finite(value)
    if converted is None:
        raise ValueError(f"{name} must be a finite number, got {_shown(value)}")
    return converted


def positive_float(value, name):
    """A finite real number ``> 0``, as a ``float``."""
    converted = _finite(value)
    if converted is None or converted <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {_shown(value)}")
    return converted


def flag(value, name):
    """A real ``bool`` (``"no"`` is truthy: accepting it would silently mean True)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def tensor(value, name, min_dim=0):
    """A ``torch.Tensor`` with at least ``min_dim`` dimensions (a list or array is refused, not converted)."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() < min_dim:
        raise ValueError(f"{name} needs at least {min_dim} dimensions, got shape {tuple(value.shape)}")
    return value


def floating(value, name, min_dim=0):
    """A real floating-point ``torch.Tensor`` (float16, bfloat16, float32, float64) with at least ``min_dim``
    dimensions. Integer, bool and complex tensors are refused, as ``F.scaled_dot_product_attention``
    refuses them: computed in integers, weights and angles would be truncated to whole numbers."""
    tensor(value, name, min_dim)
    if not value.is_floating_point():
        raise ValueError(f"{name} must be a real floating-point tensor (convert it with .float()), got {value.dtype}")
    return value


def floating_dtype(value, name):
    """A real floating-point ``torch.dtype``: ``torch.float32`` and the like, not ``"float32"`` or ``np.float32``."""
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"{name} must be a real floating-point torch dtype such as torch.float64, got {value!r}")
    return value


def integers(value, name):
    """A tensor of integers, from a tensor, list or array of integers; floats are refused, even whole ones,
    and so are values outside int64 (torch.uint64 holds them, but indexing and arithmetic wrap them).

    An empty list is an empty tensor of integers (``torch.as_tensor([])`` alone would be float32)."""
    given = value
    try:
        value = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):         # None, strings, ragged lists, ints beyond int64
        raise ValueError(f"{name} must be integers within int64 (a tensor, list or array of them),"
                         f" got {given!r:.60}") from None
    if value.numel() == 0 and not hasattr(given, "dtype"):
        value = value.long()
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise ValueError(f"{name} must be integers, got dtype {value.dtype}")
    if value.dtype == torch.uint64 and (value.view(torch.int64) < 0).any():      # 2**63 and above
        raise ValueError(f"{name} must be integers within int64, got torch.uint64 values of 2**63 or more")
    return value


def _alike(value, choice):
    """Whether ``value`` may stand for ``choice``: a bool only for a bool, a float never for an int (True == 1, 1.0 == 1)."""
    is_bool = isinstance(value, bool | np.bool_), isinstance(choice, bool | np.bool_)
    return is_bool[0] == is_bool[1] and not (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
                                             and isinstance(choice, numbers.Integral))


def one_of(value, name, choices):
    """One of ``choices``, a collection of values (a string is one value, not a collection of its substrings)."""
    if isinstance(choices, str | bytes):
        choices = (choices,)
    choices = tuple(choices)
    if not any(value is c or (_alike(value, c) and value == c) for c in choices):
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value
