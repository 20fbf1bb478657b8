"""The converter for JAX: token ids as ``int32``, JAX's index type, made in the reader.

This module imports no JAX, so that reader processes never do (:mod:`tidal.jax` makes the
global arrays in the training process).
"""

from __future__ import annotations

import numpy as np


def int32_ids(value: np.ndarray) -> np.ndarray:
    """Token ids (``uint16``/``uint32``) as ``int32``, JAX's index type; other arrays as they are.
    Done in the reader, not the training loop."""
    if value.dtype in (np.uint16, np.uint32):
        return value.astype(np.int32)
    return np.ascontiguousarray(value)
