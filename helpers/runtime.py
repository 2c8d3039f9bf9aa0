"""Seeding and device choice, so every notebook starts from the same state on any machine."""

import random

import numpy as np
import torch


def seed(value: int = 0) -> torch.Generator:
    """Seed Python, NumPy and PyTorch; return a ``torch.Generator`` seeded with the same value."""
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"seed must be a non-negative int, got {value!r}")
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    return torch.Generator().manual_seed(value)


def device() -> torch.device:
    """CUDA when present, else the CPU. Nothing in the chapter requires a GPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
