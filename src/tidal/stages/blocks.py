"""The source stage's blocks: a block of an epoch read from its files, in yield order.

A reader's share of an epoch (:mod:`tidal.stages.read`) passes through shuffle blocks; each
block is read whole (every reader of it reads it, and yields its share), from the files'
readers (:class:`~tidal.stages.readers.OpenReaders`), side by side in threads where decoding
releases the GIL, the next block read ahead, remote shards fetched ahead by the prefetcher.
Bad data meets the ``errors`` policy here; a bad record is raised or counted by the reader
whose share holds it, or, in the remainder of a finite epoch that no reader yields, by the
last reader, which reads it (:mod:`tidal.stages.owned`).

A reader's first block (a job's start, a resume) does not wait for all of it: its first batch
comes from point reads of just the records the permutation puts first (:mod:`tidal.stages.points`,
:meth:`BlockReader.block`), nothing fetched ahead before them, and the block then loads behind
them in a thread, the same records in the same order. Point reads that meet anything bad (a
record, a file that does not open) are dropped unreported, and the block is read whole as
before, which reports it: so every bad record meets the policy once, as the block read finds it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tidal import closing, env, fork_safe
from tidal.errors import FormatError, MissingDependency, SchemaError, StorageError, TidalError
from tidal.formats import Located, Piece, Reader, module, parsed_per_batch, threaded
from tidal.order import EpochOrder, Intervals
from tidal.pools import Threads
from tidal.stages import points, turns
from tidal.stages.loaded import Block, Points
from tidal.stages.owned import Owned
from tidal.stages.policy import Policy
from tidal.stages.read_threads import ReadThreads
from tidal.stages.readers import NotOpened, OpenReaders
from tidal.storage.cache import Entry
from tidal.storage.retry import redact_urls
from tidal.tables import Seen, concat, decoded, length, take
from tidal.world import World

if TYPE_CHECKING:
    from tidal.stages.plan import ReadPlan
    from tidal.storage.prefetch import Prefetcher

LOOKAHEAD_BLOCKS = 512  # how far ahead the reader looks for shards to prefetch
RELEASE_BYTES = 32 << 20
log = logging.getLogger("tidal")


class BlockReader:
    """Reads the blocks of one reader's epochs. ``reads(epoch)``: the positions the reader reads
    of it (its share, and the remainder where it reads that), which decide what it reads ahead
    and fetches, and which bad records are its own."""

    MAX_OPEN = 64  # idle readers kept open; those in use are never closed (see OpenReaders)

    def __init__(
        self,
        plan: ReadPlan,
        world: World,
        policy: Policy,
        reads: Callable[[int], Intervals],
        next_order: Callable[[int], EpochOrder | None],
        owned: Callable[[int], Intervals] | None = None,  # the positions whose bad records are its own
    ):
        self._plan, self._world, self._policy, self._reads = plan, world, policy, reads
        self._owned = owned or reads
        self._next_order = next_order  # the order of the epoch after one, None after the last
        self._readers = OpenReaders(self._open_reader, self._reader_closed, self.MAX_OPEN)
        self._block_index = -1
        self._block: Block | None = None
        self.rows_read = 0  # rows read from files, yielded or not: what a resume costs
        self.bytes_read = 0  # their bytes: each file's (of the columns read) in proportion to the rows read of it
        self._read_sizes: np.ndarray | None = None  # per shard, the bytes a read of all its rows reads
        self.skipped = 0  # bad records of this reader's share dropped under errors="skip"
        self._seen = Seen()  # column types read so far: one type per column, where the index did not know them
        self._broken: dict[int, TidalError] = {}  # shards that could not be opened: skipped from then on
        self._arrow_loaded = 0  # bytes of Arrow blocks loaded since the pool last released memory
        # the threads a block's files are read with, side by side, the next block read ahead in them
        # (tidal.stages.read_threads), where decoding releases the GIL
        remote = plan.storage is not None
        count = env.read_threads(world.num_workers, remote) if threaded(plan.shards.formats) else 0
        self._threads = ReadThreads(count, policy, self._read_held)
        # point reads (see _read_points): in threads where they add cores or wait on the network
        self._point_threads = env.read_threads(world.num_workers, remote) if remote else count
        # JSON lines: held as their lines, each batch parsed with this as it is cut (tidal.formats.jsonl);
        # None: records are parsed as they are read
        formats = plan.shards.formats
        self.parse: Callable | None = module(formats[0]).parse if parsed_per_batch(formats) else None
        self._fresh = True  # no block asked for yet: the first one's first records come from point reads
        self._loaded = 0  # blocks loaded
        # the first block, loading behind its point reads: (pid, the thread, what it raised)
        self._behind: tuple[int, threading.Thread, list[BaseException]] | None = None
        self._counting = fork_safe.Lock()  # skipped: counted by the loop's thread and the block's

    def forget(self) -> None:
        """Drop the block held (a new epoch orders the blocks anew)."""
        self._waited = self._join() or self._waited
        self._block_index, self._block = -1, None

    def close_file(self, shard: int) -> None:
        """Close shard ``shard``'s reader where none is reading with it: a bad record raised from
        its file ends the reading of it as a read that fails does, not left to the collector."""
        self._readers.close_idle(lambda i: i != shard)

    def count_skipped(self, n: int) -> None:
        with self._counting:
            self.skipped += n

    _waited: BaseException | None = None  # what the block loaded behind raised, for the next load

    def block(self, order: EpochOrder, b: int, offset: int, stop: int, max_items: int) -> Block:
        """Block ``b`` of ``order``, for the records of its positions from ``offset`` (up to
        ``stop``, ``max_items`` of them): the loaded block, or, for this reader's first block, a
        :class:`Points` of just those records while the block loads behind them."""
        if not self._fresh:
            return self.load(order, b)
        self._fresh = False
        end = min(stop, offset + max_items)
        behind = False
        try:
            found = self._points(order, b, offset, end) if self._block_index != b and end > offset else None
            if found is None:
                turns.no_point_reads()  # the block is read whole: the next worker need not wait for it
                return self.load(order, b)
            if end < stop:  # more of this reader's positions in the block: load it behind them
                self._load_behind(order, b)
                behind = True  # it lets go of what the point reads kept, once it has read it again
            return found
        finally:
            if not behind and self._remote is not None:
                self._remote.drop_kept()

    def _points(self, order: EpochOrder, b: int, first: int, end: int) -> Points | None:
        """Positions ``[first, end)`` of block ``b`` by point reads, or None where they are not
        worth it (they read half the block or more) or not possible (a format without ``around``),
        or where they met anything bad: then the block is read whole, which reports it."""
        slices = order.slices(b)
        shards = self._plan.shards
        arounds = [getattr(module(shards.formats[s]), "around", None) for s, _, _ in slices]
        if not all(arounds):
            return None
        perm = order.permutation(b)
        planned = points.plan(slices, perm, first, end, arounds, [shards.infos[s] for s, _, _ in slices])  # type: ignore[arg-type]
        if 2 * planned.read >= sum(z - a for _, a, z in slices):
            return None
        remote = self._prefetcher()
        if remote is not None:
            self._require(remote)  # a cache too small for what a block holds: an error before any read
            remote.keep()  # what the points read, the block behind them reads again: kept meanwhile
        probe: dict[str, list[TidalError]] = {}
        self._policy.deferred = probe  # what they meet is reported by the block read whole, not here
        pieces: list[Piece] | None = None
        try:
            with turns.point_reads(remote is not None) as alone:  # one worker at a time
                pieces = self._read_points(planned.runs, alone)
        except Exception as exc:
            cause = exc.cause if isinstance(exc, NotOpened) else exc
            if isinstance(cause, (StorageError, MissingDependency)):
                raise cause from None  # the network or a package, not the data: as the block read raises it
            pieces = None  # the block read whole says what went wrong
        finally:
            self._policy.deferred = None
        absent: dict[str, str] | None = None
        for piece in pieces or []:
            if length(piece.table):
                absent = piece.absent if absent is None else {c: w for c, w in absent.items() if c in piece.absent}
        whole = pieces is not None and all(  # every row of every run kept, as many as it holds
            (p.valid is None or p.valid.all()) and length(p.table) == z - a
            for p, (_, a, z) in zip(pieces, planned.runs, strict=True)
        )
        if pieces is None or not whole or probe or absent:
            for shard in {s for s, _, _ in planned.runs}:
                self._readers.drop(shard)  # what a reader holds of what it met (a salvaged group) goes too
            return None
        for s, a, z in planned.runs:
            self._count_read(s, a, z)
        files = [redact_urls(shards.paths[s]) for s, _, _ in planned.runs]
        table = points.assemble(planned, [p.table for p in pieces], files, shuffled=perm is not None)
        return Points(table, slices, planned.rows, first, end)

    def _read_points(self, runs: list[tuple[int, int, int]], alone: bool = False) -> list[Piece]:
        """The runs' pieces: a file's runs one after another (a reader reads one thing at a time),
        the files side by side in threads: for local files where decoding releases the GIL, the
        reader's share of the cores, the rank's where it reads ``alone`` (its workers' point reads
        take turns: :mod:`tidal.stages.turns`), not more (8 threads decoding on 2 cores beside
        another worker's 8 took twice the CPU time, in switches and page faults); for remote ones,
        more (they wait on the network; opening one may download it)."""
        by_file: dict[int, list[int]] = {}
        for i, (shard, _, _) in enumerate(runs):
            by_file.setdefault(shard, []).append(i)

        def read(shard: int) -> list[Piece]:
            until = max(runs[i][2] for i in by_file[shard])
            return [self._read_held(*runs[i], point=until) for i in by_file[shard]]

        threads = min(env.read_threads() if alone and self._point_threads else self._point_threads, len(by_file))
        if threads < 2:
            return [piece for shard in by_file for piece in read(shard)]
        closing.start()
        out: list[Piece | None] = [None] * len(runs)
        with Threads(threads, thread_name_prefix="tidal-point") as pool:
            for shard, pieces in zip(by_file, pool.map(read, by_file), strict=True):
                for i, piece in zip(by_file[shard], pieces, strict=True):
                    out[i] = piece
        return [piece for piece in out if piece is not None]

    def _load_behind(self, order: EpochOrder, b: int) -> None:
        """Load block ``b`` in a thread (its first records were read by point reads): the next
        :meth:`load` takes it, or raises what loading it raised."""
        owned = self._owned(order.epoch)  # worked out here: the loop's thread changes what it depends on
        failed: list[BaseException] = []

        def run() -> None:
            try:
                self.load(order, b, owned)
            except BaseException as exc:  # raised by the next load, in the loop's thread
                failed.append(exc)
            finally:
                if self._remote is not None:
                    self._remote.drop_kept()

        closing.start()
        thread = threading.Thread(target=run, name="tidal-behind", daemon=True)
        self._behind = (os.getpid(), thread, failed)
        thread.start()

    def _join(self) -> BaseException | None:
        """Wait for the block loading behind, if one is; what it raised."""
        behind, self._behind = self._behind, None
        if behind is None:
            return None
        pid, thread, failed = behind
        if pid != os.getpid():  # a fork's copy: the thread is the parent's, the block not loaded here
            self._block_index, self._block = -1, None
            return None
        thread.join()
        return failed[0] if failed else None

    def stats(self) -> dict:
        return self._remote.stats.dict() if self._remote is not None else {}

    def load(self, order: EpochOrder, b: int, owned_positions: Intervals | None = None) -> Block:
        """Block ``b`` of ``order``: its records in yield order (read once, kept until the next).
        ``owned_positions``: those whose bad records are this reader's (else asked for now)."""
        if self._behind is not None and threading.current_thread() is not self._behind[1]:
            self._waited = self._join() or self._waited
        failed, self._waited = self._waited, None
        if failed is not None:
            raise failed
        self._fresh = False
        if self._block_index == b and self._block is not None:
            return self._block
        self._block = None  # free the old block before reading the new one
        slices = order.slices(b)
        remote = self._prefetcher()
        if remote is not None:  # fetch this block's and the next blocks' shards in the background
            self._require(remote)
            now = [s for s, _, _ in slices]
            later = self._upcoming(order, b)
            # the next block's shards open already stay open, going on from a block of this epoch: so a
            # reader holds one group's shards at most (tidal.storage.room), never an old epoch's beside
            going_on = self._block_index >= 0
            first_later = [s for s, _, _ in order.slices(b + 1)] if going_on and b + 1 < order.blocks else []
            keep = {*now, *first_later}
            # done with, or read in place while a whole copy came (another epoch reads it): reopened on the copy
            self._readers.close_idle(lambda i: (i in keep and not remote.copied(i)) or not remote.is_remote(i))
            remote.ahead(now, later, settled=self._loaded > 0)
        perm = order.permutation(b)
        owned = Owned(
            self._policy, self._owned, self._plan.shards, order, b, slices, perm, owned_positions
        )  # bad records: this reader's only
        self._policy.owns = owned
        tables, files, masks, any_skipped = [], [], [], False
        absent: dict[str, str] | None = None  # columns asked for that no record of the block has so far
        shards = self._plan.shards
        for (s, a, z), piece in zip(slices, self._threads.pieces(slices, self._read, self._broken), strict=True):
            self._count_read(s, a, z)
            _check_rows(piece, shards.paths[s], a, z)
            if length(piece.table):
                absent = piece.absent if absent is None else {c: w for c, w in absent.items() if c in piece.absent}
            if piece.valid is None or piece.valid.any():
                tables.append(piece.table)
                files.append(redact_urls(shards.paths[s]))  # named where files of different types meet
            masks.append(np.ones(z - a, dtype=bool) if piece.valid is None else piece.valid)
            any_skipped |= piece.valid is not None
        if absent:
            column, where = next(iter(absent.items()))
            raise SchemaError(
                f"no record of a block of {int(order.starts[b + 1] - order.starts[b])} has the column {column!r} "
                f"asked for with columns= ({where}): a typo? A field so rare that a whole block lacks it is "
                "read without columns= (each record keeps the fields it has)"
            )
        table = concat(self._seen.conform(tables, files), files) if tables else []
        del tables  # the pieces: freed once the block is made of them
        rows = perm  # where each record of the block's table was among the slices' rows
        valid_before = None
        if any_skipped:
            valid = np.concatenate(masks)
            self.count_skipped(owned.count(~valid))  # the bad records of this reader's share
            rows = np.flatnonzero(valid) if perm is None else perm[valid[perm]]
            kept_index = np.cumsum(valid) - 1  # row in ``table`` of each kept position
            if perm is not None:
                valid = valid[perm]
                perm = kept_index[perm][valid]
            valid_before = np.concatenate([[0], np.cumsum(valid)])
        if isinstance(table, pa.Table):
            self._arrow_loaded += table.nbytes
            if perm is not None:  # permuted Python objects are cheaper than Arrow's take, then a conversion per batch
                table = decoded(table)
        if perm is not None:
            table = take(table, perm)
        self._block_index, self._block = b, Block(table, valid_before, slices, rows)
        self._loaded += 1
        self._read_ahead(order, b + 1)
        if self._arrow_loaded >= RELEASE_BYTES:  # the blocks' freed memory back to the system, now and then:
            pa.default_memory_pool().release_unused()  # a call costs ~2 ms, too much for every small block
            self._arrow_loaded = 0
        return self._block

    def _count_read(self, shard: int, a: int, z: int) -> None:
        """Rows ``[a, z)`` of ``shard`` read: in ``rows_read``, and their share of its bytes in ``bytes_read``."""
        self.rows_read += z - a
        size, n = int(self._read_size(shard)), max(1, int(self._plan.shards.rows[shard]))
        self.bytes_read += size * z // n - size * a // n  # slices of a whole file add up to its size

    def _read_size(self, shard: int) -> int:
        """The bytes of shard ``shard`` a read of all its rows reads: where only some columns are
        read and the index knows each column's bytes (Parquet's column chunks), theirs; else the
        file's. What ``bytes_read`` counts, in proportion to the rows read."""
        if self._read_sizes is None:
            shards, columns = self._plan.shards, self._plan.columns
            sizes = shards.bytes.copy()
            if columns is not None:
                for i, info in enumerate(shards.infos):
                    chunks = info.get("column_bytes")
                    if chunks:
                        sizes[i] = sum(int(chunks.get(c, 0)) for c in columns)
            self._read_sizes = sizes
        return int(self._read_sizes[shard])

    def _read_held(self, index: int, a: int, z: int, point: int | None = None) -> Piece:
        """Rows ``[a, z)`` of shard ``index``; ``point``: for point reads of it up to that row (a
        format that reads those differently, Parquet by ranges, says so with a ``point`` method)."""
        with self._readers.using(index) as reader:
            if self.parse is not None:
                return reader.unparsed(a, z)  # type: ignore[attr-defined]
            if point is not None and hasattr(reader, "point"):
                return reader.point(a, z, point)
            return reader.read(a, z)

    def _read_ahead(self, order: EpochOrder, b: int) -> None:
        """Start reading the block this reader takes after block ``b - 1`` (block ``b``, the next
        one of its share, or the first of its share of the next epoch) in the threads while the
        loop takes the batches of this one, so that it waits for a block only when it takes
        batches faster than the threads decode (one block more in memory, read, not yet made
        Python). Only for local files: remote ones are fetched ahead by the prefetcher."""
        if not self._threads.count or self._plan.storage is not None:
            return
        found = self._after(order, int(order.starts[b]) if b < order.blocks else order.total)
        if found is None:
            return
        order, b = found
        self._threads.ahead(order.slices(b), self._broken)

    def _after(self, order: EpochOrder, position: int) -> tuple[EpochOrder, int] | None:
        """The epoch's order and the block of this reader's first position at or after ``position``
        of ``order``'s epoch; past the end of its share, the first block of its next epoch's share
        (None at the end of a finite pass). A small dataset under ``repeat()`` starts an epoch
        every few blocks: without this, each reader waited for the first block of every one."""
        for a, z in self._reads(order.epoch):
            if z > position:
                return order, order.block_at(max(a, position))
        following = self._next_order(order.epoch)
        if following is None:
            return None
        intervals = self._reads(following.epoch)
        return (following, following.block_at(intervals[0][0])) if intervals else None

    def _read(
        self,
        index: int,
        a: int,
        z: int,
        done: Future[Piece] | None = None,
        deferred: dict[str, list[TidalError]] | None = None,
    ) -> Piece:
        """Rows ``[a, z)`` of shard ``index`` (or what reading them in a thread gave, ``done``,
        and skipped, ``deferred``); what its reader cannot read goes to the policy."""
        path = redact_urls(self._plan.shards[index].path)  # as its reader names it
        if index in self._broken:  # could not be opened: handed to the policy once, skipped since
            return Piece([], np.zeros(z - a, dtype=bool))
        failure: Exception
        try:
            if done is not None and deferred is not None:
                self._policy.replay(path, deferred)  # the records it skipped, then what ended it
                return done.result()
            return self._read_held(index, a, z)
        except NotOpened as exc:
            failure, opened = exc.cause, False
        except Exception as exc:
            failure, opened = exc, True
        error = self._policy.unreadable(path, failure)  # out of the except: what it re-raises keeps its own traceback
        if not opened:
            self._broken[index] = error
        self._policy(path, error)  # raises unless the policy skips it
        return Piece([], np.zeros(z - a, dtype=bool))

    def _open_reader(self, index: int) -> Reader:
        shard = self._plan.shards[index]
        columns = list(self._plan.columns) if self._plan.columns is not None else None
        info, remote, name = shard.info, self._prefetcher(), shard.path
        fmt = module(shard.format)
        held = remote if remote is not None and remote.is_remote(index) else None
        if held is not None:
            info = {**info, "file": Located(held.open(index))}  # a held local copy, or ranged reads
            name = redact_urls(shard.path)  # errors name the shard, never a signed URL's query
        try:
            near = shard.info.get("beside")  # the size and version of a file its format reads beside it
            if held is not None and isinstance(near, dict) and hasattr(fmt, "beside"):
                entry = Entry(fmt.beside(shard.path), int(near["bytes"]), near.get("version"), check=True)
                info["file"] = Located(info["file"].file, held.beside(index, entry))
            errors = self._policy.for_file(name)
            return fmt.open(name, shard.compression, info, columns, errors, self._plan.options)
        except BaseException:
            if held is not None:
                held.release(index)
            raise

    def _reader_closed(self, index: int) -> None:
        remote = self._remote
        if remote is not None and remote.is_remote(index):
            remote.release(index)  # the cache may evict its copy again

    def close(self) -> None:
        self._join()  # the block loading behind, if one is: it reads with the readers closed below
        self._threads.close()
        self._readers.close()
        self._block = None
        if self._remote is not None:
            self._remote.close()

    # -- remote shards ---------------------------------------------------------------

    _remote: Prefetcher | None = None  # created on first use, in the process that reads

    def _prefetcher(self) -> Prefetcher | None:
        storage = self._plan.storage
        if storage is None:
            return None
        if self._remote is None or self._remote.closed:
            from tidal.storage.prefetch import Prefetcher

            stats = self._remote.stats if self._remote is not None else None
            closing.start()  # its threads: as for the read threads
            self._remote = Prefetcher(self._plan.shards, storage, self._plan.columns, stats, check=self._plan.indexed)
            self._remote.again = self._plan.epochs != 1  # another epoch reads the files again
        return self._remote

    def _require(self, remote: Prefetcher) -> None:
        """Have the prefetcher check, before the first block, that the cache holds what this
        machine's readers hold at once in any epoch (:mod:`tidal.storage.room`): the readers of
        this process (DataLoader workers, continuous rows) times the ranks of the machine."""
        w, plan = self._world, self._plan
        ranks = env.local_ranks()
        who = [f"{w.num_workers} DataLoader workers"] if w.num_workers > 1 else []
        who += [f"{w.lanes} continuous rows{' each' if who else ''}"] if w.lanes > 1 else []
        who += [f"{ranks} ranks of this machine (LOCAL_WORLD_SIZE)"] if ranks > 1 else []
        readers = w.num_workers * w.lanes * ranks
        order = {"seed": plan.seed, "block_size": plan.block_size, "shards_per_block": plan.shards_per_block}
        remote.require(readers, " x ".join(who), block_bytes=plan.block_bytes, **order)

    def _upcoming(self, order: EpochOrder, b: int) -> Iterator[int]:
        """The shards of the blocks this reader reads after block ``b`` this epoch, in order, lazily."""
        intervals = self._reads(order.epoch)
        after = int(order.starts[b + 1])
        budget = LOOKAHEAD_BLOCKS
        for a, z in intervals:
            a = max(a, after)
            if a >= z:
                continue
            for block in range(order.block_at(a), order.block_at(z - 1) + 1):
                if block <= b:
                    continue
                budget -= 1
                if budget < 0:
                    return
                for s, _, _ in order.slices(block):
                    yield s


def _check_rows(piece: Piece, path: str, start: int, stop: int) -> None:
    """That a slice read gave a row for each of its records, skipped ones included: a reader (or a
    file changed since it was counted) that gives fewer would lose records without a word."""
    got = len(piece.valid) if piece.valid is not None else length(piece.table)
    kept = int(piece.valid.sum()) if piece.valid is not None else got
    if got != stop - start or length(piece.table) != kept:
        raise FormatError(
            f"{redact_urls(path)}: rows {start:,} to {stop:,} read as {got:,} records, not {stop - start:,}: "
            "the file changed since it was counted? (tidal index it again)"
        )
