"""The keys of every saved state, each named once. :mod:`tidal.state` explains what they hold."""

from __future__ import annotations

VERSION = 3  # of the loader state; a state of another version is refused

# -- a loader state: DataLoader.state_dict() --------------------------------------------------
STATE_VERSION = "version"
DATASET = "dataset"  # the dataset's fingerprint
PASS = "pass"  # complete passes over the loader before this one
FIRST_EPOCH = "first_epoch"  # the first epoch of the pass
TOPOLOGY = "topology"  # [ranks, workers]
RANKS = "ranks"  # per rank: a rank state, or None where unknown
ORIGIN = "origin"  # the progress the readers were restored from (an elastic restore), or None
SOURCES = "sources"  # per source: RECORDS per epoch, FINITE, and EPOCHS per pass (None: forever)
PROGRESS = "progress"  # per source: the epochs in progress and what of them is used up
RECORDS_PER_BATCH = "records_per_batch"  # source records in every batch, where that is fixed; else None
MIX_DRAWS = "mix_draws"  # records drawn by a mixture over all readers, kept by `skip`
SKIPPED_BATCHES = "skipped_batches"  # batches skipped by `tidal state skip`

# -- a rank state ----------------------------------------------------------------------------
NEXT_WORKER = "next_worker"  # the worker whose batch comes next
WORKERS = "workers"  # per worker: a reader state, or None before its first batch
COUNTS = "counts"
BATCHES = "batches"
TOKENS = "tokens"

# -- a reader state: one rank x worker, DatasetIterator.state() ------------------------------
READER = "reader"  # [rank, ranks, worker, workers]
POSITION = "position"  # the top stage's position at the start of the chunk being yielded
WITHIN = "within"  # items of that chunk already yielded
USED = "used"  # per source: [epoch, offset into this reader's share] used up; per lane, one after the other
ITEMS = "items"  # items yielded
RECORDS = "records"  # source positions passed

# -- stage positions -------------------------------------------------------------------------
UPSTREAM = "upstream"  # a stage's upstream position, nested
EPOCH = "epoch"
OFFSET = "offset"
PASSED = "passed"
TOKEN = "token"  # concat pack: tokens of its first chunk already packed
EMITTED = "emitted"  # best-fit pack: sequences of its buffer already yielded
DRAWS = "draws"  # mix: records drawn by this reader
PASSES = "passes"  # mix: restarts of each stream
ENDED = "ended"
EMPTY = "empty"
FRESH = "fresh"
STREAMS = "streams"
ROWS = "rows"  # continuous batch: each row's position (a row is a reader of its own: a lane)

# -- progress (elastic restores) -------------------------------------------------------------
DONE = "done"  # per epoch (a string): used-up intervals [[start, stop], ...]
FINITE = "finite"
EPOCHS = "epochs"
MIX = "@mix"  # suffix of a mixture's key in progress and origin: {DRAWS: over all readers}
