"""Schema drift across files: the records of a column have one type over the dataset, or it is an
error naming the column and files; never silently mixed data (see tidal.formats.schemas).

Corpora written over months by different jobs drift: int32 next to int64 ids, float32 next to
float64 scores, string next to large_string, dictionary-encoded next to plain text, list<int32>
next to list<int64> token ids, a column added later. Each is read here as one type, the same as
records, as batches and through DataLoader workers; text next to numbers is a SchemaError when
the dataset is opened (a fresh scan, a published index) or, from an index written before scans
kept the types, at the first block that meets both.
"""

from __future__ import annotations

import json
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fault_proxy import FaultProxy

import tidal
from tidal.formats.tokens import TokenWriter
from tidal.sources.index_file import INDEX_NAME, Entries

pytest_plugins = ["s3_fixtures"]


def drifted(root: Path) -> Path:
    """Three Parquet files of one dataset, written as different jobs would have written them."""
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "id": pa.array([0, 1, 2], pa.int32()),
                "score": pa.array([0.5, 1.5, 2.5], pa.float32()),
                "text": pa.array(["a", "b", "c"]),
                "tag": pa.array(["x", "y", "x"]).dictionary_encode(),
                "ids": pa.array([[1], [2, 3], []], pa.list_(pa.int32())),
            }
        ),
        root / "a.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "id": pa.array([3, 4], pa.int64()),
                "score": pa.array([3.5, 4.5], pa.float64()),
                "text": pa.array(["d", "e"], pa.large_string()),
                "tag": pa.array(["y", "z"]),
                "ids": pa.array([[70_000], [5, 6]], pa.list_(pa.int64())),
                "lang": pa.array(["en", "fr"]),  # added later
            }
        ),
        root / "b.parquet",
    )
    pq.write_table(
        pa.table({"ids": pa.array([[7]], pa.large_list(pa.int64())), "id": pa.array([5], pa.int64())}),
        root / "c.parquet",  # another column order, most columns missing
    )
    return root


EXPECTED = [
    {"id": 0, "score": 0.5, "text": "a", "tag": "x", "ids": [1], "lang": None},
    {"id": 1, "score": 1.5, "text": "b", "tag": "y", "ids": [2, 3], "lang": None},
    {"id": 2, "score": 2.5, "text": "c", "tag": "x", "ids": [], "lang": None},
    {"id": 3, "score": 3.5, "text": "d", "tag": "y", "ids": [70_000], "lang": "en"},
    {"id": 4, "score": 4.5, "text": "e", "tag": "z", "ids": [5, 6], "lang": "fr"},
    {"id": 5, "score": None, "text": None, "tag": None, "ids": [7], "lang": None},
]


def clashing(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"id": pa.array([1, 2], pa.int64()), "x": pa.array([1, 2], pa.int32())}), root / "a.parquet"
    )
    pq.write_table(pa.table({"id": pa.array([3, 4], pa.int64()), "x": pa.array(["p", "q"])}), root / "b.parquet")
    return root


CLASH = r"column 'x' is int32 in \S*a.parquet but string in \S*b.parquet"


def test_drifted_parquet_files_read_as_one_schema_in_records_and_batches(tmp_path: Path) -> None:
    # before: [{'id': 1, 'x': 1}, ..., {'id': 5}]: a column of two types, a key missing in one record
    ds = tidal.Dataset(drifted(tmp_path / "d"))
    assert list(ds) == EXPECTED
    assert [list(r) for r in ds] == [list(EXPECTED[0])] * 6  # every record every column, in one order
    for size in (1, 2, 3, 6):  # batches from within one file and across files
        batches = list(ds.batch(size))
        assert all(b["id"].dtype == np.int64 for b in batches)
        got = [dict(zip(b, row, strict=True)) for b in batches for row in zip(*b.values(), strict=True)]
        assert [{k: _plain(v) for k, v in r.items()} for r in got] == EXPECTED
    shuffled = list(ds.shuffle(seed=3, block_size=4))
    assert sorted(shuffled, key=lambda r: r["id"]) == EXPECTED


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value.item() if isinstance(value, np.generic) else value


def test_a_column_some_files_lack_is_null_there_with_columns_too(tmp_path: Path) -> None:
    root = drifted(tmp_path / "d")
    assert list(tidal.Dataset(root, columns=["lang", "id"])) == [{"lang": r["lang"], "id": r["id"]} for r in EXPECTED]
    assert list(tidal.Dataset(root / "c.parquet", columns=["id"])) == [{"id": 5}]
    assert [b["lang"] for b in tidal.Dataset(root, columns=["lang"]).batch(3)] == [[None] * 3, ["en", "fr", None]]
    with pytest.raises(tidal.SchemaError, match=r"no column 'langg' \(columns: .*\), nor has any other file"):
        tidal.Dataset(root, columns=["langg"])


def test_drifted_files_through_dataloader_workers_are_of_one_dtype(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ds = tidal.Dataset(drifted(tmp_path / "d"), columns=["id", "score", "ids"]).batch(1)
    batches = list(tidal.DataLoader(ds, num_workers=2))
    assert len(batches) == 6
    assert {b["id"].dtype for b in batches} == {torch.int64}
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(6))
    assert sorted(x for b in batches for ids in b["ids"] for x in ids) == [1, 2, 3, 5, 6, 7, 70_000]


def test_text_next_to_numbers_is_an_error_naming_the_column_and_files_when_opened(tmp_path: Path) -> None:
    root = clashing(tmp_path / "c")
    with pytest.raises(tidal.SchemaError, match=CLASH):
        tidal.Dataset(root)
    with pytest.raises(tidal.SchemaError, match=CLASH):  # as the index kept the types: no file read again
        tidal.Dataset(root)
    assert [r["id"] for r in tidal.Dataset(root, columns=["id"])] == [1, 2, 3, 4]  # only the column that clashes
    declared = tidal.Dataset(root, format_options={"column_types": {"x": "string"}})
    assert [r["x"] for r in declared] == ["1", "2", "p", "q"]


def test_a_declared_type_casts_every_file_and_a_value_that_does_not_is_a_record_error(tmp_path: Path) -> None:
    root = clashing(tmp_path / "c")
    ds = tidal.Dataset(root, format_options={"column_types": {"x": "int64"}})
    with pytest.raises(tidal.RecordError, match=r"b.parquet, row 0: column 'x': 'p' does not convert to int64"):
        list(ds)
    skipping = tidal.Dataset(root, format_options={"column_types": {"x": "int64"}}, errors="skip")
    assert list(skipping) == [{"id": 1, "x": 1}, {"id": 2, "x": 2}]
    with pytest.raises(tidal.SchemaError, match=r"column_types names 'y', which no file has"):
        tidal.Dataset(root, format_options={"column_types": {"y": "int64"}})
    pq.write_table(pa.table({"x": pa.array([[1]], pa.list_(pa.int64()))}), tmp_path / "l.parquet")
    with pytest.raises(tidal.SchemaError, match=r"column 'x' is list<\w+: int64> in \S*l.parquet, which does not"):
        tidal.Dataset(tmp_path / "l.parquet", format_options={"column_types": {"x": "int64"}})


def test_the_index_keeps_each_distinct_schema_once(tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for k in range(40):
        kind = pa.int32() if k % 2 else pa.int64()
        pq.write_table(pa.table({"id": pa.array([k], kind)}), root / f"part-{k:03d}.parquet")
    ds = tidal.Dataset(root)
    assert [r["id"] for r in ds] == list(range(40))
    index = json.loads((root / INDEX_NAME).read_text())
    assert len(index["schemas"]) == 2 and {i["types"] for i in index["info"]} == {0, 1}
    assert index["scan"] == [2] * 40
    # an index an older tidal rewrote (it drops the table of schemas): those entries are scanned again
    del index["schemas"]
    parsed = Entries.parse(index)
    assert all("rows" not in (parsed.get(k) or {}) for k in parsed.keys)
    (root / INDEX_NAME).write_text(json.dumps(index))
    assert [r["id"] for r in tidal.Dataset(root)] == list(range(40))
    assert len(json.loads((root / INDEX_NAME).read_text())["schemas"]) == 2


def old_index(data: bytes) -> bytes:
    """An index as tidal wrote it before scans kept the column types (Parquet's scan version 1)."""
    index = json.loads(data)
    index.pop("schemas", None)
    index["info"] = [{k: v for k, v in i.items() if k != "types"} if isinstance(i, dict) else i for i in index["info"]]
    index.pop("scan", None)
    return json.dumps(index).encode()


def test_an_old_local_index_is_scanned_again_and_the_clash_found_when_opened(tmp_path: Path) -> None:
    root = clashing(tmp_path / "c")
    with pytest.raises(tidal.SchemaError):
        tidal.Dataset(root)
    where = root / INDEX_NAME
    where.write_bytes(old_index(where.read_bytes()))
    with pytest.raises(tidal.SchemaError, match=CLASH):  # the footers read again: local, cheap
        tidal.Dataset(root)
    assert json.loads(where.read_text())["scan"] == [2, 2]


class Requests:
    """The GETs of data files through the proxy."""

    def __init__(self) -> None:
        self.gets: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, method: str, target: str, headers: list[tuple[str, str]]) -> bool:
        path = target.partition("?")[0]
        if method == "GET" and path.endswith(".parquet"):
            with self._lock:
                self.gets.append(path)
        return False  # counted, never broken


@pytest.fixture
def proxied(s3: Any) -> Any:
    requests = Requests()
    with FaultProxy(("127.0.0.1", s3.port), every=0, only=requests) as proxy:
        yield proxy, requests


@pytest.mark.slow
def test_a_published_index_keeps_the_types_so_the_clash_is_found_with_no_request_per_file(
    s3: Any, bucket: str, tmp_path: Path, proxied: Any
) -> None:
    proxy, requests = proxied
    url = s3.upload(clashing(tmp_path / "c"), bucket, "c")
    options = s3.options(proxy.endpoint)
    tidal.index(url, storage_options=options, cache_dir=tmp_path / "indexer")
    requests.gets.clear()
    with pytest.raises(tidal.SchemaError, match=r"column 'x' is int32 in s3://\S*/c/a.parquet but string in"):
        tidal.Dataset(url, storage_options=options, cache_dir=tmp_path / "node")
    assert requests.gets == []  # the footers were not read again
    url = s3.upload(drifted(tmp_path / "d"), bucket, "d")
    tidal.index(url, storage_options=options, cache_dir=tmp_path / "indexer")
    ds = tidal.Dataset(url, storage_options=options, cache_dir=tmp_path / "node2")
    assert list(ds) == EXPECTED
    assert next(iter(ds.batch(6)))["id"].dtype == np.int64


@pytest.mark.slow
def test_an_old_published_index_still_opens_and_the_clash_is_found_at_the_first_block(
    s3: Any, bucket: str, tmp_path: Path, proxied: Any
) -> None:
    proxy, requests = proxied
    options = s3.options(proxy.endpoint)
    url = s3.upload(clashing(tmp_path / "c"), bucket, "c")
    tidal.index(url, storage_options=options, cache_dir=tmp_path / "indexer")
    key = "c/" + INDEX_NAME
    s3.put(bucket, key, old_index(s3.client.get_object(Bucket=bucket, Key=key)["Body"].read()))
    requests.gets.clear()
    ds = tidal.Dataset(url, storage_options=options, cache_dir=tmp_path / "node")  # opens: its counts still hold
    assert ds.num_records == 4 and requests.gets == []
    with pytest.raises(
        tidal.SchemaError, match=r"column 'x' is int32 in s3://\S*a.parquet but string in s3://\S*b.parquet"
    ):
        list(ds)
    # the drift that promotion joins is joined block by block
    url = s3.upload(drifted(tmp_path / "d"), bucket, "d")
    tidal.index(url, storage_options=options, cache_dir=tmp_path / "indexer")
    key = "d/" + INDEX_NAME
    s3.put(bucket, key, old_index(s3.client.get_object(Bucket=bucket, Key=key)["Body"].read()))
    ds = tidal.Dataset(url, storage_options=options, cache_dir=tmp_path / "node2")
    got = list(ds)  # a reader knows a column from the first file it reads that has it
    assert got[:3] == [{k: v for k, v in r.items() if k != "lang"} for r in EXPECTED[:3]] and got[3:] == EXPECTED[3:]
    widths = [b["id"].dtype for b in ds.batch(1)]  # int32 until the first int64 file, int64 from then on
    assert widths == [np.dtype(np.int32)] * 3 + [np.dtype(np.int64)] * 3
    # tidal index scans the files again, and the next job finds the clash when it opens the dataset
    tidal.index(url.replace("/d", "/c"), storage_options=options, cache_dir=tmp_path / "indexer2")
    with pytest.raises(tidal.SchemaError, match=CLASH.replace(r"\S*a", r"s3://\S*a")):
        tidal.Dataset(url.replace("/d", "/c"), storage_options=options, cache_dir=tmp_path / "node3")


def write_arrow(path: Path, table: pa.Table, stream: bool = False) -> Path:
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(str(path), table.schema) as w:
        w.write_table(table)
    return path


def test_drifted_arrow_files_and_streams_read_as_one_schema(tmp_path: Path) -> None:
    # before: a SchemaError "columns ... differ" for int32 next to int64
    write_arrow(tmp_path / "a.arrow", pa.table({"id": pa.array([0, 1], pa.int32()), "s": pa.array(["a", "b"])}))
    write_arrow(
        tmp_path / "b.arrows",
        pa.table({"id": pa.array([2], pa.int64()), "s": pa.array(["c"], pa.large_string()), "n": pa.array([1.5])}),
        stream=True,
    )
    want = [{"id": 0, "s": "a", "n": None}, {"id": 1, "s": "b", "n": None}, {"id": 2, "s": "c", "n": 1.5}]
    ds = tidal.Dataset(tmp_path)
    assert list(ds) == want
    assert [b["id"].dtype for b in ds.batch(1)] == [np.dtype(np.int64)] * 3
    assert list(tidal.Dataset(tmp_path, columns=["n"])) == [{"n": None}, {"n": None}, {"n": 1.5}]
    declared = tidal.Dataset(tmp_path, columns=["n", "id"], format_options={"column_types": {"n": "string"}})
    assert list(declared) == [{"n": None, "id": 0}, {"n": None, "id": 1}, {"n": "1.5", "id": 2}]
    write_arrow(tmp_path / "c.arrow", pa.table({"id": pa.array(["3"])}))
    with pytest.raises(tidal.SchemaError, match=r"column 'id' is int32 in \S*a.arrow but string in \S*c.arrow"):
        tidal.Dataset(tmp_path)


def test_drifted_arrow_next_to_parquet_agree_together(tmp_path: Path) -> None:
    write_arrow(tmp_path / "a.arrow", pa.table({"id": pa.array([0], pa.int32())}))
    pq.write_table(pa.table({"id": pa.array([1], pa.int64())}), tmp_path / "b.parquet")
    assert [b["id"].dtype for b in tidal.Dataset(tmp_path).batch(1)] == [np.dtype(np.int64)] * 2


def test_two_save_to_disk_directories_of_drifted_types_read_as_one(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = lambda kind: datasets.Features({"id": datasets.Value(kind), "text": datasets.Value("string")})  # noqa: E731
    datasets.Dataset.from_dict({"id": [0, 1], "text": ["a", "b"]}, features=features("int32")).save_to_disk(
        str(tmp_path / "old")
    )
    datasets.Dataset.from_dict({"id": [2], "text": ["c"]}, features=features("int64")).save_to_disk(
        str(tmp_path / "new")
    )
    ds = tidal.Dataset([tmp_path / "old", tmp_path / "new"])
    assert list(ds) == [{"id": 0, "text": "a"}, {"id": 1, "text": "b"}, {"id": 2, "text": "c"}]
    assert {b["id"].dtype for b in ds.batch(1)} == {np.dtype(np.int64)}


def test_token_shards_of_two_dtypes_read_and_pack_as_the_wider(tmp_path: Path) -> None:
    # before: uint16 and uint32 documents side by side; a best-fit pack whose first document was
    # uint16 wrapped the ids past 65,535 of the others (70_000 became 4_464)
    small = [np.arange(i, i + 5, dtype=np.uint16) for i in range(6)]
    large = [np.arange(70_000 + i, 70_000 + i + 4, dtype=np.uint32) for i in range(6)]
    with TokenWriter(tmp_path / "a", dtype="uint16") as w:
        for d in small:
            w.write(d)
    with TokenWriter(tmp_path / "b", dtype="uint32") as w:
        for d in large:
            w.write(d)
    ds = tidal.Dataset([tmp_path / "a", tmp_path / "b"])
    docs = [r["input_ids"] for r in ds]
    assert {d.dtype for d in docs} == {np.dtype(np.uint32)}
    assert [d.tolist() for d in docs] == [d.tolist() for d in small + large]
    every = sorted(int(x) for d in docs for x in d)
    packed = [int(x) for p in ds.pack(9, "best_fit", pad_id=99_999, outputs=("input_ids",)) for x in p["input_ids"]]
    assert sorted(x for x in packed if x != 99_999) == every  # no id cut, none wrapped
    packed = [int(x) for p in ds.pack(9, outputs=("input_ids",)) for x in p["input_ids"]]
    assert packed and packed == [int(x) for d in docs for x in d][: len(packed)]


def write_megatron(prefix: Path, docs: list[np.ndarray], dtype: Any) -> None:
    seqs = [d.astype(dtype) for d in docs]
    lengths = np.array([len(s) for s in seqs], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * np.dtype(dtype).itemsize)])[:-1]
    prefix.with_suffix(".bin").write_bytes(b"".join(s.tobytes() for s in seqs))
    code = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4, np.dtype(np.float32): 7}[np.dtype(dtype)]
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(seqs), len(seqs) + 1)
    doc_index = np.arange(len(seqs) + 1, dtype="<i8")
    prefix.with_suffix(".idx").write_bytes(
        head + lengths.tobytes() + pointers.astype("<i8").tobytes() + doc_index.tobytes()
    )


def test_megatron_and_flat_token_files_of_two_dtypes_read_as_the_wider(tmp_path: Path) -> None:
    write_megatron(tmp_path / "a_text_document", [np.array([1, 2, 3]), np.array([4])], np.uint16)
    write_megatron(tmp_path / "b_text_document", [np.array([-1, 100_000])], np.int32)
    np.save(tmp_path / "c.npy", np.array([7, 8], dtype=np.int64))
    ds = tidal.Dataset(tmp_path)
    docs = [r["input_ids"] for r in ds]
    assert {d.dtype for d in docs} == {np.dtype(np.int64)}
    assert [d.tolist() for d in docs] == [[1, 2, 3], [4], [-1, 100_000], [7, 8]]
    assert next(iter(ds.batch(4)))["input_ids"][2].tolist() == [-1, 100_000]
    (tmp_path / "c.npy").unlink()
    write_megatron(tmp_path / "d_text_document", [np.array([0.5])], np.float32)
    with pytest.raises(
        tidal.SchemaError, match=r"column 'input_ids' is (uint16|int32) in \S* but float32 in \S*d_text"
    ):
        tidal.Dataset(tmp_path)
