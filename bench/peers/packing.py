"""The tokens workload for the peers, none of which packs: the same tokenize + pack around each one's record
stream, so that the peers differ only in how they read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from common import EOS

from peers.base import forever

if TYPE_CHECKING:
    from peers.spec import Spec


def packed_tokens(records: Any, tokenizer: str, seq_len: int, batch: int) -> Any:
    """The same tokenize + pack for every peer: documents taken 64 at a time from the peer's record stream,
    ``encode_batch`` + one EOS each, the token stream cut into full rows of ``seq_len``, ``batch`` rows at a
    time. An IterableDataset, so that it runs in the DataLoader workers next to the peer's own reading."""
    import numpy as np
    import torch
    from torch.utils.data import IterableDataset

    class Packed(IterableDataset):
        def __iter__(self) -> Iterator[torch.Tensor]:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(tokenizer)
            eos = np.array([tok.token_to_id(EOS)], dtype=np.int64)
            need = seq_len * batch
            pending: list[np.ndarray] = []
            have = 0
            texts: list[str] = []
            for sample in forever(records, False):
                texts.append(sample["text"])
                if len(texts) < 64:
                    continue
                for enc in tok.encode_batch(texts, add_special_tokens=False):
                    pending += [np.asarray(enc.ids, dtype=np.int64), eos]
                    have += len(enc.ids) + 1
                texts = []
                while have >= need:
                    flat = np.concatenate(pending)
                    yield torch.from_numpy(flat[:need].reshape(batch, seq_len))
                    pending, have = [flat[need:]], len(flat) - need

    return Packed()


def packed(records: Callable[[Spec], Any]) -> Callable[[Spec], Any]:
    """A peer's tokens loader: its record stream, packed, through a torch ``DataLoader(batch_size=None)``."""

    def loader(spec: Spec) -> Any:
        from torch.utils.data import DataLoader

        ds = packed_tokens(records(spec), spec.tokenizer, spec.seq_len, spec.batch)
        return DataLoader(ds, batch_size=None, num_workers=spec.workers)

    return loader
