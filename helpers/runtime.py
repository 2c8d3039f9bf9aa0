"""Seeding and device choice, so every notebook starts from the same state on any machine."""

import random

import numpy as np
import torch

from helpers.checks import non_negative_int


def seed(value: int = 0) -> torch.Generator:
    """Seed Python, NumPy and PyTorch; return a ``torch.Generator`` seeded with the same value."""
    value = non_negative_int(value, "seed")
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    return torch.Generator().manual_seed(value)


def device() -> torch.device:
    """CUDA when present, else the CPU. Nothing in the chapter requires a GPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
