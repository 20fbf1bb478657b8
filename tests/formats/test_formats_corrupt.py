"""Damaged files, every binary format: a tidal error or good records, never a raw exception from a library."""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from makers import write_megatron

import tidal
from tidal.formats.tokens import TokenWriter


def tokens_file(d: Path) -> Path:
    with TokenWriter(d, shard_size=10**6) as w:
        for i in range(8):
            w.write(np.arange(i + 2))
    (d / "index.json").unlink()  # the hash would catch every flip: test the reader's own checks
    return d / "shard-00000.tokens"


def megatron_file(d: Path) -> Path:
    return write_megatron(d / "m", [[np.arange(i + 2)] for i in range(8)])


def npy_file(d: Path) -> Path:
    np.save(d / "a.npy", np.arange(100, dtype=np.int32))
    return d / "a.npy"


def csv_file(d: Path) -> Path:
    (d / "a.csv").write_text("id,text\n" + "".join(f'{i},"t {i}"\n' for i in range(20)))
    return d / "a.csv"


def arrow_file(d: Path, stream: bool = False) -> Path:
    table = pa.table({"id": list(range(20)), "t": [f"t{i}" for i in range(20)]})
    path = d / ("a.arrows" if stream else "a.arrow")
    with (
        pa.OSFile(str(path), "wb") as sink,
        (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as w,
    ):
        w.write_table(table, max_chunksize=6)
    return path


def tar_file(d: Path) -> Path:
    with tarfile.open(d / "a.tar", "w") as tf:
        for i in range(6):
            for ext, data in [("txt", f"t{i}".encode()), ("json", b'{"i": %d}' % i), ("cls", b"%d" % i)]:
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return d / "a.tar"


def mds_file(d: Path) -> Path:
    from conftest import mds_writer

    with mds_writer()(out=str(d / "mds"), columns={"n": "int", "s": "str", "a": "ndarray"}) as w:
        for i in range(8):
            w.write({"n": i, "s": f"s{i}", "a": np.arange(i + 1)})
    return d / "mds" / "shard.00000.mds"


MAKERS: dict[str, Callable[[Path], Path]] = {
    "tokens": tokens_file, "megatron": megatron_file, "npy": npy_file, "csv": csv_file, "arrow": arrow_file,
    "arrow-stream": lambda d: arrow_file(d, stream=True), "tar": tar_file, "mds": mds_file,
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_flipped_and_truncated_bytes_raise_only_tidal_errors(tmp_path: Path, kind: str) -> None:
    rng = np.random.default_rng(0)
    (tmp_path / "orig").mkdir()
    original = MAKERS[kind](tmp_path / "orig")
    data = original.read_bytes()
    for trial in range(40):
        d = tmp_path / f"t{trial}"
        d.mkdir()
        copy = d / original.name
        for sibling in original.parent.iterdir():  # a Megatron .idx, an MDS index.json
            if sibling.is_file() and not sibling.name.startswith("."):
                (d / sibling.name).write_bytes(sibling.read_bytes())
        damaged = bytearray(data)
        if trial % 2:
            damaged = damaged[: int(rng.integers(0, len(damaged)))]
        else:
            for at in rng.integers(0, len(damaged), size=int(rng.integers(1, 4))):
                damaged[at] = int(rng.integers(0, 256))
        if kind == "megatron" and trial % 4 < 2:  # damage the index instead
            idx = d / "m.idx"
            raw = bytearray(idx.read_bytes())
            raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
            idx.write_bytes(bytes(raw))
            damaged = bytearray(data)
        copy.write_bytes(bytes(damaged))
        with contextlib.suppress(tidal.TidalError):  # anything else fails the test
            list(tidal.Dataset(copy))
