"""Saved states: what they hold, how they are read back, and the tools that edit them.

A state is plain JSON: ints, strings, lists and dicts, never a buffer or a pickled object.
Its keys are named once, in :mod:`tidal.state.keys`; this package is the only code that knows
how a loader state is laid out (:mod:`tidal.state.schema`), how a loader keeps its state batch
by batch, loads, restores and saves it (:mod:`tidal.state.ledger`, one for ``tidal.DataLoader``
and ``tidal.jax.Loader`` alike), how a state saved on one topology restores on another
(:mod:`tidal.state.elastic`) and how one is shown or edited (:mod:`tidal.state.edit`). The
words, each with one meaning:

- **position**: where one stage's iterator is, exactly; a stage with an upstream nests the
  upstream's position under ``upstream`` (a stage whose place is its upstream's, such as
  ``map`` or ``batch``, reports its upstream's position as its own).
- **reader state**: one reader's (rank x DataLoader worker) position plus what it has
  ``used`` of each source and its ``counts``, and where ``set_weights`` changed its mixture's
  weights, the changes its position still needs (``weights``: per row, ``[draw, {stream:
  weight}]``, see :mod:`tidal.stages.weights`); ``Dataset.iterator().state()``.
- **rank state**: per worker, its reader state after the last batch the training loop
  consumed, and which worker is next.
- **loader state**: every rank's state, the topology, and per source the ``progress`` (the
  used-up positions of the epochs in progress), from which another topology restores, the
  mixture ``weights`` in force where ``set_weights`` set them, and its calls since the state
  before (``weight_calls``, :mod:`tidal.state.calls`);
  ``DataLoader.state_dict()``, and ``tidal.jax.Loader.state_dict()`` (its ranks are JAX
  processes, its workers the loader's readers).

Reading a state back goes through :class:`View`, which checks every value it hands out, so a
malformed or hostile state is a :class:`~tidal.errors.StateError` that names the key.
"""

from __future__ import annotations

from tidal.state.edit import merge, show, skip
from tidal.state.view import View, check_int

__all__ = ["View", "check_int", "merge", "show", "skip"]
