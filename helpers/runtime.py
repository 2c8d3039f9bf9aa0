"""Seeding, device choice and the thread count, so every notebook starts from the same state on any machine."""

import contextlib
import numbers
import random

import numpy as np
import torch


def seed(value: int = 0) -> torch.Generator:
    """Seed Python, NumPy and PyTorch; return a ``torch.Generator`` seeded with the same value.

    ``value`` is an int in ``0 .. 2**32 - 1``, the range every one of them takes (NumPy's is the
    narrowest); it is checked before any generator is seeded, so a refused seed changes none.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < 2**32:
        raise ValueError(f"seed must be an int in 0..2**32 - 1 (the range NumPy takes), got {value!r}")
    value = int(value)
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    return torch.Generator().manual_seed(value)


def device() -> torch.device:
    """CUDA when present, else the CPU. Nothing in the chapter requires a GPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def threads(n):
    """Torch's CPU kernels on ``n`` threads while inside (None: as they are), then on the count there was, also
    when the body raises. A sum split over threads adds in another order, so a result computed on one thread
    is the same on any machine."""
    if n is None:
        yield
        return
    from helpers.checks import positive_int
    before = torch.get_num_threads()
    torch.set_num_threads(positive_int(n, "threads"))
    try:
        yield
    finally:
        torch.set_num_threads(before)
