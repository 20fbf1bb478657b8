"""Every reader against damaged files: only tidal errors naming the file, no hang, no silent loss.

For each format, plain and with each compression it allows, hypothesis takes a valid shard
written by the format's usual writer and damages it: cuts it short, flips bytes, inserts or
deletes bytes, appends junk; sometimes after the index was built, keeping the file's size and
modification time (bit rot the index cannot notice). The damaged shard is read beside an
intact one of the same format, whole, with ``errors="raise"`` and with ``errors="skip"``:

- only a :class:`tidal.TidalError` comes out (under ``"skip"``, only a ``SchemaError``: a
  damaged header that renames a column), and its message names the damaged file;
- nothing hangs: each input has a deadline;
- nothing is lost silently. Under ``"raise"``: an error, or records in which the damage cannot
  be seen: exactly the original ones where every byte is checked (gzip, bz2, zstd with
  checksums) or where a cut leaves a file that is whole (a tar's padding), a prefix of them
  where a cut can fall between records (JSON lines, an Arrow stream), a prefix with a
  shortened last record where the format cannot tell (text, CSV, headerless token files);
  after other damage, records that parse. Under ``"skip"`` (two epochs): every record of the
  intact shard, the same records both epochs, and every record the index counted for the
  damaged one either read or counted in ``skipped``, or the whole file counted in
  ``bad_files`` with no records in the index.

The inputs fuzzed per reader are written to ``$TMPDIR/tidal-fuzz-readers.json`` (quoted in
docs/reliability.md). The default run keeps the file under a minute and draws the same
inputs each time; the ``slow`` one draws many more, new ones each run.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from makers import write_megatron

import tidal
from tidal.formats.tokens import TokenWriter

FAST = 60  # inputs per reader in the default run
LONG = 100  # and in the slow one (new inputs every run: CI explores as it goes)
DEADLINE_S = 30.0  # per input; generous: the test machine is shared

COUNTS: Counter[str] = Counter()
SECONDS: Counter[str] = Counter()


# -- valid shards ----------------------------------------------------------------------


def _text(rng: np.random.Generator) -> str:
    alphabet = [*"abcdefgh ,.;:-_'!?0123456789", "é", "ß", "日本", "\\", '"', "\t", "💡"]
    return "".join(rng.choice(alphabet, size=int(rng.integers(1, 24)))).strip() or "x"


def _records(rng: np.random.Generator) -> list[dict]:
    return [{"id": i, "text": _text(rng), "x": round(float(rng.random()), 3)} for i in range(int(rng.integers(1, 16)))]


def _compress(data: bytes, compression: str | None) -> bytes:
    if compression == "gz":
        return gzip.compress(data)
    if compression == "zst":
        return zstandard.ZstdCompressor(write_checksum=True).compress(data)
    if compression == "bz2":
        return bz2.compress(data)
    return data


def _ending(compression: str | None) -> str:
    return f".{compression}" if compression else ""


def jsonl(compression: str | None) -> Callable[[Path, str, np.random.Generator], list[Path]]:
    def write(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _records(rng)).encode()
        path = d / f"{name}.jsonl{_ending(compression)}"
        path.write_bytes(_compress(data, compression))
        return [path]

    return write


def text(compression: str | None) -> Callable[[Path, str, np.random.Generator], list[Path]]:
    def write(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
        data = "".join(_text(rng) + "\n" for _ in range(int(rng.integers(1, 16)))).encode()
        path = d / f"{name}.txt{_ending(compression)}"
        path.write_bytes(_compress(data, compression))
        return [path]

    return write


def csv(compression: str | None) -> Callable[[Path, str, np.random.Generator], list[Path]]:
    def write(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
        rows = "".join(f'{r["id"]},"{r["text"].replace(chr(34), chr(34) * 2)}",{r["x"]}\n' for r in _records(rng))
        path = d / f"{name}.csv{_ending(compression)}"
        path.write_bytes(_compress(("id,text,x\n" + rows).encode(), compression))
        return [path]

    return write


def parquet(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
    path = d / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(_records(rng)), path, row_group_size=4, write_page_checksum=True)
    return [path]


def arrow(stream: bool) -> Callable[[Path, str, np.random.Generator], list[Path]]:
    def write(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
        table = pa.Table.from_pylist(_records(rng))
        path = d / f"{name}.{'arrows' if stream else 'arrow'}"
        new = pa.ipc.new_stream if stream else pa.ipc.new_file
        with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as w:
            w.write_table(table, max_chunksize=4)
        return [path]

    return write


def tar(compression: str | None) -> Callable[[Path, str, np.random.Generator], list[Path]]:
    def write(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for r in _records(rng):
                arr = io.BytesIO()
                np.save(arr, np.arange(r["id"] + 1, dtype=np.int16))
                for ext, data in [("txt", r["text"].encode()), ("json", json.dumps(r).encode()),
                                  ("cls", b"%d" % r["id"]), ("npy", arr.getvalue())]:  # fmt: skip
                    info = tarfile.TarInfo(f"{name}{r['id']:03d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        path = d / f"{name}.tar{_ending(compression)}"
        path.write_bytes(_compress(buf.getvalue(), compression))
        return [path]

    return write


def mds(compression: str | None) -> Callable[[Path, str, np.random.Generator], list[Path]]:
    def write(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
        from conftest import mds_writer

        out = d / f"_{name}"
        columns = {"id": "int", "text": "str", "x": "float64", "a": "ndarray", "j": "json"}
        with mds_writer()(out=str(out), columns=columns, compression=compression) as w:
            for r in _records(rng):
                w.write({**r, "a": np.arange(r["id"] + 1, dtype=np.int32), "j": {"k": r["text"]}})
        (shard,) = out.glob("shard.00000.mds*")
        path = d / shard.name.replace("00000", "00000" if name == "a" else "00001")
        shard.rename(path)
        shutil.rmtree(out)
        return [path]

    return write


def litdata(level: str | None) -> Callable[[Path, np.random.Generator], tuple[list[Path], list[Path]]]:
    """LitData chunks, plain or zstd-compressed at ``level`` (batch: frames of 2 items)."""

    def write(d: Path, rng: np.random.Generator) -> tuple[list[Path], list[Path]]:
        from litdata.streaming.writer import BinaryWriter

        first, second = _records(rng), _records(rng)
        second = second[: len(first)]  # chunk_size = len(first): the second chunk holds the rest
        zstd = {"compression": "zstd", "compression_level": level, "compression_batch_size": 2} if level else {}
        if level != "batch":
            zstd.pop("compression_batch_size", None)
        writer = BinaryWriter(str(d), chunk_size=len(first), **zstd)
        for i, r in enumerate(first + second):
            writer[i] = {"text": r["text"], "id": r["id"], "v": np.arange(r["id"] + 1, dtype=np.int32)}
        writer.done()
        writer.merge()
        ending = ".zstd.bin" if level == "chunk" else ".bin"
        return [d / f"chunk-0-0{ending}"], [d / f"chunk-0-1{ending}"]

    return write


def megatron(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
    docs = [
        [rng.integers(0, 50_000, int(rng.integers(1, 30))) for _ in range(int(rng.integers(1, 3)))]
        for _ in range(int(rng.integers(1, 8)))
    ]
    bin_path = write_megatron(d / name, docs)
    return [bin_path, bin_path.with_suffix(".idx")]


def flat_bin(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
    path = d / f"{name}.bin"  # 4,096 uint16 ids a row: a few rows, the last one short
    path.write_bytes(rng.integers(0, 65_535, int(rng.integers(1, 12_000)), dtype="<u2").tobytes())
    return [path]


def flat_npy(d: Path, name: str, rng: np.random.Generator) -> list[Path]:
    path = d / f"{name}.npy"
    np.save(path, rng.integers(0, 2**31 - 1, int(rng.integers(1, 6_000)), dtype=np.int32))
    return [path]


def token_shards(d: Path, rng: np.random.Generator, hashed: bool) -> tuple[list[Path], list[Path]]:
    docs = [rng.integers(0, 65_535, int(rng.integers(0, 40))) for _ in range(int(rng.integers(2, 16)))]
    half = len(docs) // 2
    with TokenWriter(d, dtype="uint16") as w:
        for doc in docs[:half]:
            w.write(doc)
        w._flush()  # the first shard ends here (a writer closes shards by size; these are tiny)
        for doc in docs[half:]:
            w.write(doc)
    if not hashed:
        (d / "index.json").unlink()  # the hash catches every change: test the reader's own checks
    return [d / "shard-00000.tokens"], [d / "shard-00001.tokens"]


def pair(write: Callable[[Path, str, np.random.Generator], list[Path]]) -> Callable[..., tuple[list[Path], list[Path]]]:
    def both(d: Path, rng: np.random.Generator) -> tuple[list[Path], list[Path]]:
        return write(d, "a", rng), write(d, "b", rng)

    return both


@dataclass(frozen=True)
class Reader:
    """How to write a valid pair of shards, and what damage to them can leave unseen."""

    write: Callable[[Path, np.random.Generator], tuple[list[Path], list[Path]]]
    cut: str = "framed"  # what a cut can leave unseen: "framed" (nothing: a header or footer tells),
    # "prefix" (whole records: an exact prefix), "partial" (a prefix, its last record shortened)
    checked: bool = False  # every byte checked: any damage is an error, or changes nothing read
    rechecked: bool = True  # checked again when read (not only when indexed): bit rot is caught too
    needs: str | None = None  # a package the writer needs
    widens: bool = False  # one type per column over the files (CSV): a damaged file's text can make
    # the intact file's column text too, each value the text it was written as


def as_read(got: list[Any], want: list[Any], widens: bool) -> bool:
    """Whether ``got`` is the intact shard's records ``want``, read (a column widened to text, where it can be).
    A damaged header that renames a column (a byte of an MDS ``index.json``'s ``text`` flipped to
    ``uext``) is another schema, not damage anything can see: the intact records then carry that
    column too, null, as records of a dataset whose files drifted do."""
    if len(got) == len(want) and got != want:
        got = [{k: v for k, v in g.items() if k in w or v is not None} for g, w in zip(got, want, strict=True)]
    if not widens or len(got) != len(want):
        return got == want
    return all(
        g.keys() == w.keys() and all(g[k] == w[k] or (isinstance(g[k], str) and g[k] == str(w[k])) for k in g)
        for g, w in zip(got, want, strict=True)
    )


def _readers() -> dict[str, Reader]:
    out = {}
    for comp in (None, "gz", "zst", "bz2"):
        suffix = f".{comp}" if comp else ""
        plain = comp is None
        out[f"jsonl{suffix}"] = Reader(pair(jsonl(comp)), cut="prefix" if plain else "framed", checked=not plain)
        out[f"text{suffix}"] = Reader(pair(text(comp)), cut="partial" if plain else "framed", checked=not plain)
    for comp in (None, "gz", "zst"):
        suffix = f".{comp}" if comp else ""
        out[f"csv{suffix}"] = Reader(
            pair(csv(comp)), cut="partial" if comp is None else "framed", checked=bool(comp), widens=True
        )
    out["parquet"] = Reader(pair(parquet))
    out["arrow"] = Reader(pair(arrow(stream=False)))
    out["arrow-stream"] = Reader(pair(arrow(stream=True)), cut="prefix")
    out["webdataset"] = Reader(pair(tar(None)))
    out["webdataset.gz"] = Reader(pair(tar("gz")), checked=True)
    out["mds"] = Reader(pair(mds(None)), needs="streaming")
    out["mds.zstd"] = Reader(pair(mds("zstd")), needs="streaming")  # Mosaic writes no zstd checksum
    out["litdata"] = Reader(litdata(None), needs="litdata")
    # zstd by batch and by sample (LitData writes no checksum); a whole-chunk stream is checked to its end
    out["litdata.zstd-batch"] = Reader(litdata("batch"), needs="litdata")
    out["litdata.zstd-sample"] = Reader(litdata("sample"), needs="litdata")
    out["litdata.zstd-chunk"] = Reader(litdata("chunk"), needs="litdata")
    out["megatron"] = Reader(pair(megatron))
    out["flat.bin"] = Reader(pair(flat_bin), cut="partial")
    out["flat.npy"] = Reader(pair(flat_npy))
    out["tokens"] = Reader(lambda d, rng: token_shards(d, rng, hashed=False))
    # the hash is checked when the shard is indexed; reads are zero-copy views, never hashed
    out["tokens+hash"] = Reader(lambda d, rng: token_shards(d, rng, hashed=True), checked=True, rechecked=False)
    return out


READERS = _readers()
SEEDS = 3  # valid shards per reader; each damaged in many ways


# -- what was read, comparable -----------------------------------------------------------


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist()) if value.dtype.kind == "f" else value.tolist()
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float) and value != value:  # damage can make a NaN, which equals nothing
        return "NaN"
    return value


def cut_short(got: Any, want: Any) -> bool:
    """Whether ``got`` is ``want`` with its end cut off (as the last record of a cut file is)."""
    if got == want or got is None:
        return True
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(cut_short(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) <= len(want) and got == want[: len(got)]
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):  # "0.377" cut to "0." reads as 0.0
        return str(want).startswith(str(got).rstrip("0").rstrip(".") if "." in str(got) else str(got))
    return str(want).startswith(str(got))


@dataclass
class Original:
    dir: Path
    damaged: list[Path]  # the first shard's files: its data file first (a Megatron .idx after it)
    records: list[Any]  # of the first shard
    intact: list[Any]  # of the second
    checked: bool  # when indexed
    rechecked: bool  # when read


class Originals:
    """Valid pairs of shards, written once per (reader, seed) and copied for each input."""

    def __init__(self, root: Path):
        self.root = root
        self._made: dict[tuple[str, int], Original] = {}

    def get(self, name: str, seed: int) -> Original:
        key = (name, seed)
        if key not in self._made:
            d = self.root / f"{name}-{seed}"
            d.mkdir()
            reader = READERS[name]
            first, second = reader.write(d, np.random.default_rng([seed, len(name)]))
            records = [plain(r) for r in tidal.Dataset(first[0])]
            intact = [plain(r) for r in tidal.Dataset(second[0])]
            checked = reader.checked
            if first[0].name.endswith(".zst"):  # a zstd frame is checked whole only with its checksum
                checked = zstandard.get_frame_parameters(first[0].read_bytes()).has_checksum
            self._made[key] = Original(d, first, records, intact, checked, checked and reader.rechecked)
        return self._made[key]


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Originals]:
    yield Originals(tmp_path_factory.mktemp("originals"))
    out = Path(tempfile.gettempdir()) / "tidal-fuzz-readers.json"
    report = {n: {"inputs": COUNTS[n], "seconds": round(SECONDS[n], 1)} for n in sorted(COUNTS)}
    out.write_text(json.dumps(report, indent=1))
    print(f"\nfuzzed inputs per reader (also in {out}): {report}")


# -- damage --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Damage:
    kind: str  # truncate, flip, zero (a run of zero bytes, as a crash leaves), insert, delete, append
    at: int = 0
    data: bytes = b""
    count: int = 0
    after_index: bool = False  # done once the index was built, keeping size and mtime

    def apply(self, raw: bytes) -> bytes:
        if self.kind == "truncate":
            return raw[: self.at]
        if self.kind == "flip":
            out = bytearray(raw)
            for i, x in enumerate(self.data):
                out[(self.at + 7919 * i) % len(out)] ^= x
            return bytes(out)
        if self.kind == "zero":
            return raw[: self.at] + bytes(len(raw[self.at : self.at + self.count])) + raw[self.at + self.count :]
        if self.kind == "insert":
            return raw[: self.at] + self.data + raw[self.at :]
        if self.kind == "delete":
            return raw[: self.at] + raw[self.at + self.count :]
        return raw + self.data


def draw_damage(data: st.DataObject, size: int) -> Damage:
    kind = data.draw(st.sampled_from(["truncate", "flip", "flip", "zero", "insert", "delete", "append"]), "kind")
    at = data.draw(st.integers(0, max(size - 1, 0)), "at")
    if kind == "truncate":
        return Damage(kind, at)
    if kind == "flip":
        flips = data.draw(st.binary(min_size=1, max_size=3).filter(lambda b: all(b)), "xor")
        return Damage(kind, at, flips, after_index=data.draw(st.booleans(), "after_index"))
    if kind in ("delete", "zero"):
        return Damage(kind, at, count=data.draw(st.integers(1, 64), "count"), after_index=kind == "zero")
    return Damage(kind, at, data.draw(st.binary(min_size=1, max_size=32), kind))


# -- the checks ------------------------------------------------------------------------------


def names_file(error: BaseException, files: list[Path]) -> bool:
    return any(str(f) in str(error) for f in files)


def read_raise(d: Path) -> list[Any]:
    return [plain(r) for r in tidal.Dataset(d)]


def check_raise(o: Original, d: Path, damage: Damage, cut: str, widens: bool) -> None:
    files = [d / f.name for f in o.damaged]
    try:
        got = read_raise(d)
    except tidal.TidalError as exc:
        assert names_file(exc, files), f"the error does not name the damaged file: {exc}"
        return
    n = len(got) - len(o.intact)
    assert n >= 0 and as_read(got[n:], o.intact, widens), "the intact shard was not read whole"
    part = got[:n]
    if o.checked if not damage.after_index else o.rechecked:
        assert part == o.records, "a checked file read differently without an error"
    elif damage.kind == "truncate":
        if cut == "framed" or damage.after_index:
            assert part == o.records, "a cut file read without an error"
        elif cut == "prefix":
            assert part == o.records[:n], "a cut file read as other than a prefix of its records"
        else:
            assert prefix_cut_short(part, o.records), "a cut file read as other than a prefix of its records"


def prefix_cut_short(part: list[Any], records: list[Any]) -> bool:
    """``part`` is the first records of ``records``, the last of them maybe cut short."""
    n = len(part)
    return n == 0 or (part[:-1] == records[: n - 1] and n <= len(records) and cut_short(part[-1], records[n - 1]))


def check_skip(o: Original, d: Path, damage: Damage, cut: str, widens: bool) -> None:
    files = [d / f.name for f in o.damaged]
    try:
        ds = tidal.Dataset(d, errors="skip")
        it = ds.repeat(2).iterator(tidal.World())
        got = [plain(r) for r in it]
    except tidal.SchemaError as exc:  # a damaged header that names other columns
        assert names_file(exc, files), f"the error does not name the damaged file: {exc}"
        return
    stats = it.stats()
    shard = ds.shards[0]
    assert len(got) % 2 == 0 and got[: len(got) // 2] == got[len(got) // 2 :], "two epochs differ"
    got = got[: len(got) // 2]
    n = len(got) - len(o.intact)
    assert n >= 0 and as_read(got[n:], o.intact, widens), "the intact shard was not read whole"
    part = got[:n]
    if shard.error is not None:
        assert shard.rows == 0 and n == 0 and stats["bad_files"] >= 1 and names_file(Exception(shard.error), files)
        return
    assert n + stats["skipped"] // 2 == shard.rows, f"{shard.rows} records indexed, {n} read, {stats} counted"
    if o.checked and not damage.after_index:
        assert part == o.records, "a checked file read differently without an error"
    if damage.kind == "truncate" and not damage.after_index:
        if cut == "framed":
            assert part == o.records
        else:  # records can only be lost at the end: skipped there, or not seen
            assert prefix_cut_short(part, o.records), "a cut file read as other than a prefix of its records"


def check_repeat(o: Original, d: Path) -> None:
    """The damaged shard alone, forever under "skip": records, or an error naming it; never a spin."""
    files = [d / f.name for f in o.damaged]
    want = 2 * len(o.records) + 1
    try:
        got = list(itertools.islice(tidal.Dataset(files[0], errors="skip").repeat(), want))
    except tidal.TidalError as exc:
        assert names_file(exc, files), f"the error does not name the damaged file: {exc}"
        return
    assert len(got) == want


def within(seconds: float, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` in a thread; a hang fails the test instead of blocking it."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no answer within {seconds} s: a hang"
    if outcome:
        raise outcome[0]


def fuzz_one(originals: Originals, name: str, data: st.DataObject) -> None:
    reader = READERS[name]
    o = originals.get(name, data.draw(st.integers(0, SEEDS - 1), "seed"))
    target = data.draw(st.sampled_from(o.damaged), "file")
    raw = target.read_bytes()
    damage = draw_damage(data, len(raw))
    damaged = damage.apply(raw)
    if damage.after_index and len(damaged) != len(raw):
        damage = Damage(damage.kind, damage.at, damage.data)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for f in o.dir.iterdir():  # not the index tidal left when reading the originals
            if not f.name.startswith("."):
                (d / f.name).write_bytes(f.read_bytes())
        if damage.after_index:
            tidal.Dataset(d)  # indexed intact, then damaged in place: same size, same mtime
            st_ = os.stat(d / target.name)
            (d / target.name).write_bytes(damaged)
            os.utime(d / target.name, ns=(st_.st_atime_ns, st_.st_mtime_ns))
        else:
            (d / target.name).write_bytes(damaged)
        within(DEADLINE_S, check_raise, o, d, damage, reader.cut, reader.widens)
        within(DEADLINE_S, check_skip, o, d, damage, reader.cut, reader.widens)
        within(DEADLINE_S, check_repeat, o, d)
    COUNTS[name] += 1
    SECONDS[name] += time.perf_counter() - start


def _available(name: str) -> Any:
    needs = READERS[name].needs
    marks = []
    if needs is not None:
        import importlib.util

        if importlib.util.find_spec(needs) is None:
            marks.append(pytest.mark.skip(reason=f"{needs} is not installed"))
    return pytest.param(name, marks=marks)


PARAMS = [_available(n) for n in READERS]
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


@pytest.mark.parametrize("name", PARAMS)
@settings(max_examples=FAST, derandomize=True, **COMMON)  # the same inputs every run: CI stays reproducible
@given(data=st.data())
def test_damaged_files_raise_named_errors_or_lose_nothing(originals: Originals, name: str, data: st.DataObject) -> None:
    fuzz_one(originals, name, data)


@pytest.mark.slow
@pytest.mark.parametrize("name", PARAMS)
@settings(max_examples=LONG, **COMMON)  # new inputs every run; a failure prints how to reproduce it
@given(data=st.data())
def test_damaged_files_many_more(originals: Originals, name: str, data: st.DataObject) -> None:
    fuzz_one(originals, name, data)
