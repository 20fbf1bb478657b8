"""How batches travel from a reader to the training loop, one way:

    worker ─▶ bundle (bundles.py) ─▶ ring of shared memory (rings.py) ─▶ converter ─▶ loop

A reader's batches are grouped into *bundles* of consecutive batches, each column stacked
and each text column one buffer, with the reader state after every batch
(:mod:`tidal.transport.bundles`). A worker process writes a bundle's arrays into its ring of
shared memory and sends where they are (:mod:`tidal.transport.rings`). The training process
takes the batches out round robin over its readers and converts them for its framework:
torch tensors (:mod:`tidal.transport.torch`), or arrays for JAX (:mod:`tidal.transport.jax`).
:mod:`tidal.transport.pool` runs readers in threads or spawned processes for loaders that are
not torch's (``tidal.jax.Loader``).
"""
