"""What ranks tell each other crosses as plain data, as JSON, never a pickle (a rank never runs
what it receives): rank 0's listing of a dataset, through the process group's store, and every
rank's part of the loader state, gathered by ``state_dict()``."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from conftest import make_shards

import tidal
from tidal.sources import discover
from tidal.sources.shards import NO_INFO, Shards

torch = pytest.importorskip("torch")


@pytest.fixture
def store() -> object:
    """A real torch.distributed TCPStore, as a process group's default store is one."""
    return torch.distributed.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)


class Planted:
    """What unpickling runs: it writes a file."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.write_text, (self.path, "ran"))


def test_a_listing_crosses_as_json_and_reads_back_the_same(tmp_path: Path) -> None:
    shards = tidal.Dataset(make_shards(tmp_path / "data", [3, 4, 5])).shards
    shards = Shards(
        shards.paths, shards.rows, shards.bytes, shards.formats, shards.compressions, shards.infos,
        ["etag-1", None, "etag-3"], [None, "sha256:00", None], [None, None, "unreadable: truncated"],
    )  # fmt: skip
    data = discover.listing_json(shards, True)
    assert json.loads(data)["indexed"] is True  # JSON, not a pickle
    got, indexed = discover.parse_listing(data)
    assert indexed is True and got == shards
    for name in Shards._ORDER:
        want, found = getattr(shards, name), getattr(got, name)
        assert np.array_equal(found, want) if isinstance(want, np.ndarray) else found == want, name
    assert all(info is NO_INFO for info, was in zip(got.infos, shards.infos, strict=True) if not was)


def test_a_pickle_in_the_store_is_never_unpickled(store: object, tmp_path: Path) -> None:
    """Whatever sits under the listing's key (here, a pickle that would write a file when
    loaded) is read as JSON or not at all: the rank lists the dataset itself."""
    planted = tmp_path / "planted"
    store.set("tidal/dataset/x/0/started", b"1")
    store.set("tidal/dataset/x/0/shards", pickle.dumps((Planted(planted), True)))
    assert discover._from_rank_0(store, "tidal/dataset/x/0") is None
    assert not planted.exists()


def test_rank_0s_error_crosses_as_its_name_and_message(store: object, tmp_path: Path) -> None:
    store.set("tidal/dataset/y/0/started", b"1")
    store.set("tidal/dataset/y/0/error", json.dumps(["SourceError", "s3://b/x: no such file"]).encode())
    with pytest.raises(tidal.SourceError, match=r"s3://b/x: no such file"):
        discover._from_rank_0(store, "tidal/dataset/y/0")
    planted = tmp_path / "planted"
    store.set("tidal/dataset/z/0/started", b"1")
    store.set("tidal/dataset/z/0/error", pickle.dumps(Planted(planted)))
    with pytest.raises(tidal.TidalError, match=r"rank 0 could not open the dataset"):
        discover._from_rank_0(store, "tidal/dataset/z/0")
    assert not planted.exists()


@pytest.mark.slow
def test_the_loader_state_is_gathered_over_ranks_as_json(tmp_path: Path) -> None:
    """Under torchrun, with torch.distributed's object collectives (pickle) made to fail: every
    rank's state_dict() holds both ranks' parts, the same on both, and restores exactly."""
    import procs

    data = make_shards(tmp_path / "data", [30, 25, 20])
    out = tmp_path / "out"
    out.mkdir()
    script = Path(__file__).parents[1] / "distributed" / "run_gather.py"
    procs.torchrun(script, str(data), str(out), nproc=2, env=procs.child_env(tmp_path / "cache"))
    runs = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert runs[0]["state"] == runs[1]["state"]
    assert all(rank is not None for rank in runs[0]["state"]["ranks"])
    for run in runs:
        assert run["resumed"] == run["rest"]
