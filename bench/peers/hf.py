"""HF ``datasets`` streaming: ``load_dataset("parquet", streaming=True)`` over tidal's Parquet copy (HF has no
format of its own to convert to), shuffled with a buffer, through a torch ``DataLoader``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from peers.base import Copy, Peer
from peers.packing import packed
from peers.tidal import PARQUET

if TYPE_CHECKING:
    from peers.spec import Spec

COPIES: tuple[Copy, ...] = ()  # it reads tidal's Parquet copy


def records(spec: Spec) -> Any:
    from datasets import load_dataset

    if spec.url:  # a glob of the objects; storage_options go to fsspec (s3fs), the credentials from the environment
        files: Any = f"{spec.url}/{PARQUET.pattern}"
        options = {"endpoint_url": spec.endpoint}
        ds = load_dataset("parquet", data_files=files, streaming=True, split="train", storage_options=options)
        return ds.shuffle(seed=spec.seed, buffer_size=1000)
    files = PARQUET.files(spec.root)
    ds = load_dataset("parquet", data_files=files, streaming=True, split="train")
    return ds.shuffle(seed=spec.seed, buffer_size=1000)


def loader(spec: Spec) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(records(spec), batch_size=spec.batch, num_workers=spec.workers)


PEERS = (
    Peer(
        "hf", PARQUET, loader, packed(records),
        how="load_dataset('parquet', data_files='s3://bench/parquet/*.parquet', streaming=True, storage_options={'endpoint_url': ...})",
    ),
)  # fmt: skip
