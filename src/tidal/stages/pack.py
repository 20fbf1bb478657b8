"""Packing: token streams into fixed-length sequences for causal language models.

Every sequence carries ``input_ids``, ``labels``, ``position_ids`` (restarting at each
document, and at the start of the sequence) and ``segment_ids`` (1, 2, ... per document
piece in the sequence, 0 on padding), which varlen attention kernels take as document
boundaries; :func:`cu_seqlens` turns a batch's ``position_ids`` into the cumulative lengths
FlashAttention's varlen functions want.

``labels``: with ``shift_labels=True`` (default) ``labels[i]`` is the token that follows
``input_ids[i]``, ready for a plain cross-entropy; with ``shift_labels=False`` they are
aligned with ``input_ids``, for models that shift internally (Hugging Face). Padding, and
with ``mask_boundaries=True`` every prediction across a document boundary, is ``-100``.

Strategies:

- ``concat``: documents (each ending in EOS) joined and cut every ``seq_len`` tokens. No
  token is lost except the last remainder of the stream, shorter than one sequence.
- ``best_fit``: best-fit-decreasing over a buffer of about ``buffer_size`` sequences' worth of
  documents (pulled a few at a time until they hold ``buffer_size * seq_len`` tokens); a document
  is cut only when it is longer than ``seq_len``. Sequences are padded
  with ``pad_id``; ``stats()`` reports the padding fraction.

State is a position, never a token buffer: the upstream position where the current chunk
(concat) or buffer (best_fit) began, plus an offset into it. A restore re-reads and
re-tokenizes that one chunk or buffer. For an elastic restore, ``used()`` counts (concat) the
documents begun, through the locator of the chunk's upstream table; best_fit's buffer is not
counted: it is packed again.

This module is the stage; each strategy's iterator is a module of its own
(:mod:`~tidal.stages.pack_concat`, :mod:`~tidal.stages.pack_best_fit`), and what both share (the
configuration, documents as token arrays, sequences cut from them) is :mod:`~tidal.stages.packing`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from tidal.stages import Context, StageIterator, Step
from tidal.stages.pack_best_fit import BestFitPackIterator
from tidal.stages.pack_concat import ConcatPackIterator
from tidal.stages.packing import IGNORE, OUTPUTS, PackConfig
from tidal.state import keys as k
from tidal.state.view import View

__all__ = ["IGNORE", "OUTPUTS", "Pack", "PackConfig", "cu_seqlens"]


@dataclass(frozen=True, repr=False)
class Pack(Step):
    """Packs the documents of its upstream; the arguments of ``pack()`` are the fields of its :class:`PackConfig`."""

    METHOD = "pack"

    config: PackConfig

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        up = self.upstream.open(ctx, position.view(k.UPSTREAM) if position is not None else None)
        if self.config.strategy == "best_fit":
            return BestFitPackIterator(up, self.config, position, ctx.trace)
        anew = ctx.weights is not None and ctx.weights.switching  # set_weights: draw what is not begun anew
        return ConcatPackIterator(up, self.config, position, ctx.trace, anew)

    def shifts_labels(self) -> bool:
        return self.config.shift_labels

    def facts(self) -> list:  # what sequences hold, not which arrays are made of them: outputs is left out
        return [getattr(self.config, f.name) for f in fields(self.config) if f.name != "outputs"]

    def call(self) -> str:
        c = self.config
        return (
            f"pack({c.seq_len}, {c.strategy!r}, shift_labels={c.shift_labels}, "
            f"mask_boundaries={c.mask_boundaries}, pad_id={c.pad_id}, buffer_size={c.buffer_size}, "
            f"column={c.column!r}, eos={c.eos}{'' if c.outputs == OUTPUTS else f', outputs={c.outputs!r}'})"
        )

    @classmethod
    def fields_of(cls) -> type:
        return PackConfig

    def config_values(self) -> PackConfig:
        return self.config

    def config_args(self) -> dict[str, Any]:
        args = super().config_args()
        args["outputs"] = None if self.config.outputs == OUTPUTS else list(self.config.outputs)  # a list in JSON
        return {k: v for k, v in args.items() if v is not None}


def cu_seqlens(position_ids: np.ndarray) -> np.ndarray:
    """Cumulative document lengths of a flattened batch, for FlashAttention's varlen functions.

    >>> cu_seqlens(batch["position_ids"])   # int32 array: [0, len0, len0+len1, ..., B*L]
    """
    flat = np.asarray(position_ids).reshape(-1)
    starts = np.flatnonzero(flat == 0)
    return np.concatenate([starts, [len(flat)]]).astype(np.int32)
