"""The matrix's data: files of every format whose records say who they are.

Record ``i`` (an id from 1 up, unique over a cell's streams) is, in every format, the document
of ``length(i)`` tokens all equal to ``i``: the text ``"i i i"`` (which :func:`tokenizer`
encodes to exactly those ids, then EOS), or the token ids themselves (token shards, Megatron).
So a record is known from any row that holds it (its ``id`` column, the first word of its
text, its first token id) and so is every token of a packed row: token ``t > 0`` belongs to
record ``t``. EOS (and best-fit padding) is 0, no record's id.

A :class:`Corpus` is what was written: per file (named as the shard list names it, relative to
the corpus's root) the ids of its rows in order, ``None`` for a bad record. The checks compare
what tidal yields with it, never with what tidal says about itself.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

EOS = 0
MAX_ID = 4000  # ids stay below this: the tokenizer's vocabulary, and uint16 token shards

# formats and what they can hold
TEXT_FORMATS = ("jsonl", "jsonl.zst", "parquet", "csv", "text", "webdataset", "litdata")
TOKEN_FORMATS = ("tokens", "megatron")
FORMATS = TEXT_FORMATS + TOKEN_FORMATS
BAD_FORMATS = ("jsonl", "jsonl.zst", "csv", "text", "webdataset")  # where a record can be malformed alone
OPTIONAL_FORMATS = ("jsonl", "jsonl.zst", "parquet", "csv")  # a "meta" field: missing, null or a string
EMPTY_FORMATS = ("jsonl", "jsonl.zst", "parquet", "csv", "text", "webdataset", "megatron")  # an empty file is valid

SHAPES = ("files", "small", "large", "empty", "bad", "optional")


def length(i: int) -> int:
    """Tokens of record ``i`` before EOS: 1 to 9."""
    return 1 + (i * 7) % 9


def text_of(i: int) -> str:
    return " ".join([str(i)] * length(i))


def document(i: int) -> list[int]:
    """Record ``i`` as ``pack`` sees it: its tokens, then EOS."""
    return [i] * length(i) + [EOS]


def meta_of(i: int) -> str | None:
    """The optional field: a string, or None (missing or null in the file)."""
    return None if i % 3 != 2 else f"m{i}"


@dataclass
class Corpus:
    """Files written under ``root``: ``files[name]`` is the ids of its rows (``None``: a bad record)."""

    fmt: str
    root: Path
    files: dict[str, list[int | None]] = field(default_factory=dict)
    text_column: str = "text"  # where the text is (WebDataset: "txt"); token formats: "input_ids"
    optional: bool = False  # records carry the optional field "meta" (see meta_of)
    base: str | None = None  # where tidal reads it, where not from ``root``: its URL

    @property
    def ids(self) -> list[int]:
        return [i for rows in self.files.values() for i in rows if i is not None]

    @property
    def bad(self) -> set[tuple[str, int]]:
        """``(file, row)`` of every bad record."""
        return {(name, r) for name, rows in self.files.items() for r, i in enumerate(rows) if i is None}

    @property
    def records(self) -> int:
        """Records of the corpus as its index counts them: bad ones too."""
        return sum(len(rows) for rows in self.files.values())

    def at(self, name: str, row: int) -> int | None:
        return self.files[name][row]

    def name_of(self, path: str) -> str:
        """The corpus's name of a file the shard list names: under ``base``, its directory or URL."""
        base = (self.base or str(self.root)).rstrip("/") + "/"
        if path.startswith(base) and path[len(base) :] in self.files:
            return path[len(base) :]
        raise KeyError(f"{path} is not a file of the corpus at {base}")


# -- layouts: the ids each file holds -----------------------------------------------------------


def layout(shape: str, rng: np.random.Generator, first: int, size: int) -> list[list[int | None]]:
    """About ``size`` records from id ``first`` up, in files of the ``shape``; ``None``: a bad record."""
    if shape == "small":  # many small files, all in one shuffle block
        sizes = [int(n) for n in rng.integers(1, 4, max(8, size // 2))]
    elif shape == "large":
        sizes = [size]
    else:
        k = int(rng.integers(3, 8))
        sizes = [int(n) for n in rng.multinomial(size - k, np.ones(k) / k) + 1]
    files: list[list[int | None]] = []
    at = first
    for n in sizes:
        files.append(list(range(at, at + n)))
        at += n
    if shape == "empty":  # empty files first, last and between
        for where in sorted({0, len(files), int(rng.integers(0, len(files) + 1))}, reverse=True):
            files.insert(where, [])
    if shape == "bad":  # a bad record first in a file, last in one, and a few anywhere
        files[0].insert(0, None)
        files[-1].append(None)
        for _ in range(int(rng.integers(1, 4))):
            f = files[int(rng.integers(0, len(files)))]
            f.insert(int(rng.integers(0, len(f) + 1)), None)
    return files


# -- writers: one per format, the files of a layout under ``root`` ------------------------------

BAD_LINE = b'{"id": 1, "text": "cut short'  # not JSON
BAD_UTF8 = b"\xff\xfe not UTF-8"


def _record(i: int, optional: bool) -> dict:
    r: dict = {"id": i, "text": text_of(i)}
    if optional:
        if i % 3 == 1:
            r["meta"] = None
        elif i % 3 == 2:
            r["meta"] = meta_of(i)
    return r


def _jsonl(root: Path, files: list[list[int | None]], optional: bool, zst: bool) -> dict[str, list[int | None]]:
    out = {}
    for k, ids in enumerate(files):
        name = f"part-{k:03d}.jsonl" + (".zst" if zst else "")
        data = b"".join(
            BAD_LINE + b"\n" if i is None else json.dumps(_record(i, optional)).encode() + b"\n" for i in ids
        )
        (root / name).write_bytes(zstandard.ZstdCompressor().compress(data) if zst else data)
        out[name] = ids
    return out


def _parquet(root: Path, files: list[list[int | None]], optional: bool) -> dict[str, list[int | None]]:
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())] + ([("meta", pa.string())] if optional else []))
    out = {}
    for k, ids in enumerate(files):
        name = f"part-{k:03d}.parquet"
        rows = [{**_record(i, False), **({"meta": meta_of(i)} if optional else {})} for i in ids if i is not None]
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), root / name, row_group_size=7)
        out[name] = ids
    return out


def _csv(root: Path, files: list[list[int | None]], optional: bool) -> dict[str, list[int | None]]:
    out = {}
    for k, ids in enumerate(files):
        name = f"part-{k:03d}.csv"
        lines = [b"id,text,meta" if optional else b"id,text"]
        for i in ids:
            if i is None:
                lines.append(b"1,2,3,4")  # a row of the wrong number of fields
            elif optional:
                lines.append(f"{i},{text_of(i)},{meta_of(i) or ''}".encode())
            else:
                lines.append(f"{i},{text_of(i)}".encode())
        (root / name).write_bytes(b"\n".join(lines) + b"\n")
        out[name] = ids
    return out


def _text(root: Path, files: list[list[int | None]]) -> dict[str, list[int | None]]:
    out = {}
    for k, ids in enumerate(files):
        name = f"part-{k:03d}.txt"
        (root / name).write_bytes(b"".join((BAD_UTF8 if i is None else text_of(i).encode()) + b"\n" for i in ids))
        out[name] = ids
    return out


def _webdataset(root: Path, files: list[list[int | None]]) -> dict[str, list[int | None]]:
    out = {}
    serial = 0
    for k, ids in enumerate(files):
        name = f"part-{k:03d}.tar"
        with tarfile.open(root / name, "w") as tf:
            for i in ids:
                serial += 1
                members = [("cls", str(i or 0).encode()), ("txt", BAD_UTF8 if i is None else text_of(i).encode())]
                for ext, data in members:
                    info = tarfile.TarInfo(f"s{serial:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        out[name] = ids
    return out


def _litdata(root: Path, files: list[list[int | None]]) -> dict[str, list[int | None]]:
    """LitData's own writer, a chunk every few records: the files are its chunks."""
    from litdata.streaming.writer import BinaryWriter

    ids = [i for f in files for i in f if i is not None]
    chunk = max(1, len(ids) // max(1, len(files)))
    writer = BinaryWriter(str(root), chunk_size=chunk)
    for n, i in enumerate(ids):
        writer[n] = {"id": i, "text": text_of(i)}
    writer.done()
    writer.merge()
    out: dict[str, list[int | None]] = {}
    at = 0
    for c in json.loads((root / "index.json").read_text())["chunks"]:
        out[c["filename"]] = list(ids[at : at + c["chunk_size"]])
        at += c["chunk_size"]
    return out


def _tokens(root: Path, files: list[list[int | None]]) -> dict[str, list[int | None]]:
    from tidal.formats.tokens import TokenWriter

    with TokenWriter(root, dtype="uint16") as w:
        for ids in files:
            for i in ids:
                assert i is not None
                w.write(np.full(length(i), i, dtype=np.uint16))
            w._flush()  # a shard per file of the layout (the writer closes shards by size)
    shards = json.loads((root / "index.json").read_text())["shards"]
    kept = [ids for ids in files if ids]
    return {s["name"]: list(ids) for s, ids in zip(shards, kept, strict=True)}


def _megatron(root: Path, files: list[list[int | None]]) -> dict[str, list[int | None]]:
    from makers import write_megatron

    out = {}
    for k, ids in enumerate(files):
        docs = [[np.full(length(i), i, dtype=np.uint16)] for i in ids if i is not None]
        out[write_megatron(root / f"part-{k:03d}", docs).name] = ids
    return out


def write(fmt: str, root: Path, shape: str, rng: np.random.Generator, first: int, size: int) -> Corpus:
    """A corpus of ``fmt`` in ``root`` (made), about ``size`` records from id ``first`` up."""
    root.mkdir(parents=True)
    files = layout(shape, rng, first, size)
    optional = shape == "optional"
    if fmt in ("jsonl", "jsonl.zst"):
        written = _jsonl(root, files, optional, zst=fmt == "jsonl.zst")
    elif fmt == "parquet":
        written = _parquet(root, files, optional)
    elif fmt == "csv":
        written = _csv(root, files, optional)
    elif fmt == "text":
        written = _text(root, files)
    elif fmt == "webdataset":
        written = _webdataset(root, files)
    elif fmt == "litdata":
        written = _litdata(root, files)
    elif fmt == "tokens":
        written = _tokens(root, files)
    elif fmt == "megatron":
        written = _megatron(root, files)
    else:
        raise ValueError(f"no writer for {fmt!r}")
    column = "input_ids" if fmt in TOKEN_FORMATS else "txt" if fmt == "webdataset" else "text"
    return Corpus(fmt, root, written, column, optional)


def tokenizer(path: Path) -> Path:
    """``tokenizer.json`` at ``path``: word ``"i"`` is token ``i``, ``<eos>`` is token 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {str(i): i for i in range(1, MAX_ID)} | {"<eos>": EOS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path
