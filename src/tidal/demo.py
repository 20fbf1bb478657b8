"""The demo: train a small GPT-style model on a text stream, interrupt it, resume it exactly.

With no network and no credentials: the corpus is the docstrings of Python's standard
library, written as sharded JSON lines and Parquet; a byte-level BPE tokenizer is trained on
it (and cached); a small GPT-2 (random initialisation, CPU) trains on the shuffled,
tokenized, packed stream through 2 DataLoader workers. Halfway it saves a checkpoint with
the loader's state; a new process resumes from it, and the demo checks that the resumed run
trained on exactly the batches the uninterrupted run did.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

MODULES = (
    "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "email", "enum", "fractions", "functools", "gzip", "hashlib", "heapq", "html", "http.client",
    "inspect", "io", "ipaddress", "itertools", "json", "logging", "math", "multiprocessing", "operator",
    "os", "pathlib", "pickle", "platform", "pprint", "queue", "random", "re", "shutil", "socket",
    "sqlite3", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "time", "tokenize", "traceback", "typing", "unittest", "urllib.parse", "uuid",
    "warnings", "weakref", "xml.dom.minidom", "zipfile",
)  # fmt: skip
SHARDS = 8
SEED = 2026
VOCAB = 4096
SEQ_LEN = 128
BATCH = 8
STEPS = 240


def corpus() -> list[dict]:
    """One record per docstring of the listed standard-library modules, in a fixed order."""
    records: list[dict] = []
    seen: set[str] = set()
    for name in MODULES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(name)
        objects: list[tuple[str, Any]] = [(name, mod)]
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr)
            if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
                objects.append((f"{name}.{attr}", obj))
                if inspect.isclass(obj):
                    objects += [
                        (f"{name}.{attr}.{m}", f) for m, f in sorted(vars(obj).items()) if inspect.isfunction(f)
                    ]
        for qualname, obj in objects:
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= 40 and doc not in seen:
                seen.add(doc)
                records.append({"id": len(records), "name": qualname, "text": doc})
    return records


def build(out: Path) -> Path:
    """Write the corpus as SHARDS files: half JSON lines compressed with zstd, half Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    if (out / "DONE").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    records = corpus()
    for s in range(SHARDS):
        part = records[s::SHARDS]
        if s % 2 == 0:
            data = "".join(json.dumps(r) + "\n" for r in part).encode()
            (out / f"docs-{s:02d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
        else:
            pq.write_table(pa.Table.from_pylist(part), out / f"docs-{s:02d}.parquet", row_group_size=256)
    (out / "DONE").write_text(str(len(records)))
    return out


def tokenizer(corpus_dir: Path, out: Path) -> Path:
    """A byte-level BPE tokenizer trained on the corpus; cached after the first run."""
    if out.exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    import tidal

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator((r["text"] for r in tidal.Dataset(corpus_dir, columns=["text"])), trainer)
    tok.save(str(out))
    return out


def stream(corpus_dir: Path, tokenizer_file: Path):  # -> tidal.Dataset
    import tidal

    return (
        tidal.Dataset(corpus_dir, columns=["text"])
        .shuffle(seed=SEED)
        .repeat()
        .tokenize(tokenizer_file)
        .pack(SEQ_LEN)
        .batch(BATCH)
    )


def model():  # -> a small GPT-2
    import torch
    import transformers

    torch.manual_seed(SEED)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=128, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0,  # <|endoftext|> is the tokenizer's first token
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # no dropout: a resumed run can match bit for bit
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def digest(batch: dict) -> str:
    return hashlib.sha1(batch["input_ids"].numpy().tobytes()).hexdigest()[:12]


def train(base: Path, start: int, stop: int, save_at: int | None, desc: str) -> tuple[list[str], float]:
    """Train steps ``start..stop`` (resuming from ``checkpoint-{start}`` when start > 0)."""
    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    import tidal
    from tidal.progress import loader_postfix

    torch.set_num_threads(1)  # a core for training, the other for the 2 data workers
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    loader = tidal.DataLoader(stream(base / "docs", base / "tokenizer.json"), num_workers=2, prefetch_factor=1)
    if start > 0:
        ckpt = torch.load(base / f"checkpoint-{start}" / "train.pt")
        net.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(json.loads((base / f"checkpoint-{start}" / "data.json").read_text()))
    digests = []
    bar = tqdm(total=stop - start, desc=desc, unit="step", dynamic_ncols=True)
    batches = iter(loader)
    for step in range(start, stop):
        batch = next(batches)
        digests.append(digest(batch))
        logits = net(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch["labels"].view(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", **loader_postfix(loader.metrics()))  # tokens/s, data wait
        bar.update()
        if save_at is not None and step + 1 == save_at:
            folder = base / f"checkpoint-{save_at}"
            folder.mkdir(exist_ok=True)
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, folder / "train.pt")
            (folder / "data.json").write_text(json.dumps(loader.state_dict()))
    bar.close()
    return digests, loss.item()


def main(root: str = "demo-data") -> int:
    base = Path(root).resolve()
    took = {"corpus": time.perf_counter()}  # when each phase started
    data = build(base / "docs")
    took["tokenizer"] = time.perf_counter()
    tok_file = tokenizer(data, base / "tokenizer.json")
    took["training"] = time.perf_counter()
    import tidal

    ds = tidal.Dataset(data)
    print(f"corpus: {ds.num_records} docstrings of Python's standard library, {len(ds.shards)} shards in {data}")
    print(f"tokenizer: byte-level BPE, {VOCAB} tokens, {tok_file}")
    print(f"model: GPT-2, 2 layers, {SEQ_LEN}-token sequences packed on the fly, batch {BATCH}, 2 DataLoader workers")
    half = STEPS // 2
    full, loss = train(base, 0, STEPS, save_at=half, desc="training")
    print(
        f"saved a checkpoint at step {half} with the loader state ({len((base / f'checkpoint-{half}' / 'data.json').read_bytes())} bytes)"
    )
    took["resumed run"] = time.perf_counter()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-m", "tidal.demo", "--resume", str(base), str(half)],
        check=True, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    rest, resumed_loss = json.loads(out.stdout.strip().splitlines()[-1])
    same = rest == full[half:]
    print(
        f"resumed in a new process from step {half}: trained on the same {len(rest)} batches as the uninterrupted run: {'yes' if same else 'NO'}"
    )
    print(f"loss at step {STEPS}: uninterrupted {loss:.4f}, resumed {resumed_loss:.4f}")
    ends = [*list(took.values())[1:], time.perf_counter()]
    phases = ", ".join(f"{name} {end - start:.0f} s" for (name, start), end in zip(took.items(), ends, strict=True))
    print(f"took {ends[-1] - took['corpus']:.0f} s: {phases}")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--resume":
        print(json.dumps(train(Path(sys.argv[2]), int(sys.argv[3]), STEPS, None, "resumed")))
    else:
        sys.exit(main(*sys.argv[1:2]))
