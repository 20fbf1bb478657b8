"""``bench_peers.py``'s parts: one module per peer, each giving its copies of the corpus and its loaders through
the small interface of ``base``, and the machinery that runs them all alike.

- the peers: ``tidal`` (on JSONL and Parquet), ``litdata``, ``mosaic``, ``webdataset``, ``hf``; ``base``, what each
  provides; ``packing``, the tokenize + pack put around the peers' record streams;
- ``corpus``: the corpus and every copy of it, each made once; ``spec``: what one measurement is; ``harness``: one
  measurement in a fresh process, its memory sampled; ``workloads``: what a child measures; ``plan``: the measurements, named and interleaved;
  ``s3``: the s3 workload's server;
- ``tables``, ``sections``, ``report``: summaries, a table and its targets per workload, the header and the plot.

This module is the registry: every loader, in the order of the tables, and what follows from it.
"""

from __future__ import annotations

from peers import hf, litdata, mosaic, tidal, webdataset
from peers.base import Copy, Peer

_MODULES = (tidal, litdata, mosaic, webdataset, hf)
PEERS: dict[str, Peer] = {p.name: p for m in _MODULES for p in m.PEERS}
COPIES: dict[str, Copy] = {c.fmt: c for m in _MODULES for c in m.COPIES}  # every copy, in the tables' order
LOADERS = tuple(PEERS)
TIDAL = tuple(p.name for p in tidal.PEERS)
RESUMABLE = tuple(name for name, p in PEERS.items() if p.resumable)  # the ones with state_dict()
FORMAT_OF = {name: p.copy.fmt for name, p in PEERS.items()}  # the copy each loader reads
DATA_FILES = {fmt: c.pattern for fmt, c in COPIES.items()}
