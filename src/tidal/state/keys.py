"""The keys of every saved state, each named once. :mod:`tidal.state` explains what they hold."""

from __future__ import annotations

from typing import Final

VERSION: Final = 3  # of the loader state; a state of another version is refused

# -- a loader state: DataLoader.state_dict() --------------------------------------------------
STATE_VERSION: Final = "version"
DATASET: Final = "dataset"  # the dataset's fingerprint
PASS: Final = "pass"  # complete passes over the loader before this one
FIRST_EPOCH: Final = "first_epoch"  # the first epoch of the pass
TOPOLOGY: Final = "topology"  # [ranks, workers]
RANKS: Final = "ranks"  # per rank: a rank state, or None where unknown
ORIGIN: Final = "origin"  # the progress the readers were restored from (an elastic restore), or None
SOURCES: Final = "sources"  # per source: RECORDS per epoch, FINITE, and EPOCHS per pass (None: forever)
PROGRESS: Final = "progress"  # per source: the epochs in progress and what of them is used up
RECORDS_PER_BATCH: Final = "records_per_batch"  # source records in every batch, where that is fixed; else None
MIX_DRAWS: Final = "mix_draws"  # records drawn by a mixture over all readers, kept by `skip`
SKIPPED_BATCHES: Final = "skipped_batches"  # batches skipped by `tidal state skip`
WEIGHTS: Final = "weights"  # mixture weights set by loader.set_weights, in force; in a reader state, its changes
WEIGHT_CALLS: Final = "weight_calls"  # set_weights calls since the state before: {TOTAL, CALLS} (tidal.state.calls)
TOTAL: Final = "total"  # calls over the whole run
CALLS: Final = "calls"  # the last of them since the state before: [[pass, batches, {stream: weight}], ...]

# -- a rank state ----------------------------------------------------------------------------
NEXT_WORKER: Final = "next_worker"  # the worker whose batch comes next
WORKERS: Final = "workers"  # per worker: a reader state, or None before its first batch
COUNTS: Final = "counts"
BATCHES: Final = "batches"
TOKENS: Final = "tokens"

# -- a reader state: one rank x worker, DatasetIterator.state() ------------------------------
READER: Final = "reader"  # [rank, ranks, worker, workers]
POSITION: Final = "position"  # the top stage's position at the start of the chunk being yielded
WITHIN: Final = "within"  # items of that chunk already yielded
USED: Final = "used"  # per source: [epoch, offset into this reader's share] used up; per lane, one after the other
ITEMS: Final = "items"  # items yielded
RECORDS: Final = "records"  # source positions passed

# -- stage positions -------------------------------------------------------------------------
UPSTREAM: Final = "upstream"  # a stage's upstream position, nested
EPOCH: Final = "epoch"
OFFSET: Final = "offset"
PASSED: Final = "passed"
TOKEN: Final = "token"  # concat pack: tokens of its first chunk already packed
EMITTED: Final = "emitted"  # best-fit pack: sequences of its buffer already yielded
DRAWS: Final = "draws"  # mix: records drawn by this reader
PASSES: Final = "passes"  # mix: restarts of each stream
ENDED: Final = "ended"
EMPTY: Final = "empty"
FRESH: Final = "fresh"
STREAMS: Final = "streams"
ROWS: Final = "rows"  # continuous batch: each row's position (a row is a reader of its own: a lane)

# -- progress (elastic restores) -------------------------------------------------------------
DONE: Final = "done"  # per epoch (a string): used-up intervals [[start, stop], ...]
FINITE: Final = "finite"
EPOCHS: Final = "epochs"
MIX: Final = "@mix"  # suffix of a mixture's key in progress and origin: {DRAWS: over all readers}
