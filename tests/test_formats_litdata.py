"""LitData directories written by the real ``litdata.optimize`` (slow to start: one module fixture)."""

from __future__ import annotations

import json
import multiprocessing
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tidal
from tidal.testing import assert_resumes_exactly

litdata = pytest.importorskip("litdata")
pytestmark = pytest.mark.slow  # litdata.optimize starts worker processes: seconds per dataset


def plain(i: int) -> dict:
    return {"text": f"doc {i}", "n": i, "x": i / 4}


def mixed(i: int) -> dict:
    return {"text": f"doc {i}", "n": i, "raw": bytes([i, 7]), "v": np.arange(i + 1, dtype=np.int32),
            "m": np.full((2, 3), i, dtype=np.float32), "pair": (i, f"p{i}")}  # fmt: skip


def tokens(i: int):
    yield np.arange(i * 10, i * 10 + 3 + i, dtype=np.uint16)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    from litdata.streaming.item_loader import TokensLoader

    method = multiprocessing.get_start_method(allow_none=True)

    root = tmp_path_factory.mktemp("lit")
    out = {"plain": root / "plain", "mixed": root / "mixed", "tokens": root / "tokens"}
    litdata.optimize(fn=plain, inputs=list(range(20)), output_dir=str(out["plain"]), chunk_size=6, num_workers=1)
    litdata.optimize(fn=mixed, inputs=list(range(14)), output_dir=str(out["mixed"]), chunk_size=4, num_workers=1)
    litdata.optimize(fn=tokens, inputs=list(range(12)), output_dir=str(out["tokens"]), chunk_size=40, num_workers=1,
                     item_loader=TokensLoader())  # fmt: skip
    # optimize() sets the process's start method to spawn, for every later test's DataLoader workers
    multiprocessing.set_start_method(method, force=True)
    yield out


def test_plain_records_read_back_through_the_arrow_footer(dirs: dict[str, Path]) -> None:
    assert len(list(dirs["plain"].glob("chunk-*.bin"))) == 4
    assert list(tidal.Dataset(dirs["plain"])) == [plain(i) for i in range(20)]
    assert list(tidal.Dataset(dirs["plain"], columns=["n"]))[:2] == [{"n": 0}, {"n": 1}]


def test_pytree_leaves_read_back(dirs: dict[str, Path]) -> None:
    got = list(tidal.Dataset(dirs["mixed"]))
    assert len(got) == 14
    for i, g in enumerate(got):
        want = mixed(i)
        assert g.keys() == want.keys() and g["pair"] == (i, f"p{i}")
        assert (g["text"], g["n"], g["raw"]) == (want["text"], want["n"], want["raw"])
        for k in ("v", "m"):
            assert g[k].dtype == want[k].dtype and np.array_equal(g[k], want[k])


def test_token_chunks_are_documents(dirs: dict[str, Path]) -> None:
    got = [r["input_ids"] for r in tidal.Dataset(dirs["tokens"])]
    want = [next(tokens(i)) for i in range(12)]
    assert len(got) == 12 and all(g.dtype == np.uint16 and np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_tree_shuffle_and_resume(dirs: dict[str, Path]) -> None:
    for name in ("plain", "mixed", "tokens"):
        ds = tidal.Dataset(dirs[name])
        assert len(list(ds.shuffle(seed=0))) == ds.num_records
        assert assert_resumes_exactly(ds.shuffle(seed=1, block_size=8).batch(3)) == ds.num_records // 3
    with pytest.raises(tidal.FormatError, match=r"columns .* differ"):  # two different datasets in one tree
        tidal.Dataset(dirs["plain"].parent)


def test_bad_item_offsets_are_a_format_error(dirs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(dirs["mixed"], tmp_path / "m"))
    chunk = copy / json.loads((copy / "index.json").read_text())["chunks"][1]["filename"]
    data = bytearray(chunk.read_bytes())
    struct.pack_into("<I", data, 8, 1 << 30)
    chunk.write_bytes(bytes(data))
    with pytest.raises(tidal.FormatError, match=rf"{chunk.name}: corrupt item offsets"):
        tidal.Dataset(copy)
