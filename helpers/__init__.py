"""Shared plumbing for the chapter's notebooks: figure style, seeding, data, models, training.

The code a reader is meant to study stays in the notebooks; what lives here is tested in tests/.
"""

from helpers.plotting import PALETTE, save_figure, use_style
from helpers.runtime import device, seed

__all__ = ["PALETTE", "device", "save_figure", "seed", "use_style"]
