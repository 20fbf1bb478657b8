"""Pre-tokenized packing into (8, 2048) int64 batches: tidal next to LitData's TokensLoader.

The same documents (synthetic token ids, log-normal lengths around 800 tokens, uint16) are
written once as tidal token shards (``TokenWriter``) and once by ``litdata.optimize`` with its
``TokensLoader``. Each measurement runs in a fresh process for ``--seconds`` after its first
batch; configurations are interleaved, rep by rep, and the medians of ``--repeats`` are printed
with the load average. Beside them: the page-cache bandwidth of the same bytes (the token files
read whole, in a loop), which bounds any loader of them.

What each side yields, so the ratios are read right: tidal ``pack(2048).batch(8)`` through
``tidal.DataLoader`` gives int64 ``input_ids``, ``labels``, ``position_ids`` and ``segment_ids``
(8, 2048); ``-lean`` is ``pack(2048, outputs=("input_ids",))``, int64 ``input_ids`` alone;
``-parquet`` reads the same documents from a Parquet ``list<uint16>`` column, ``-megatron`` from
Megatron-LM ``.bin``/``.idx`` pairs (a sequence per document), ``-litdata`` from LitData's own
``TokensLoader`` chunks (a document per item); LitData gives
uint16 (8, 2049) windows, and the ``+ int64`` rows add what a training loop then does with them
(``x = b[:, :-1].long(); y = b[:, 1:].long()``).

    .venv/bin/python bench/bench_tokens.py                 # 40M tokens, 3 repeats, 6 s each
    .venv/bin/python bench/bench_tokens.py --quick         # 5M tokens, 1 repeat, 2 s each
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
kind, workers, root, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
if kind.startswith("tidal"):
    import tidal
    source, column = (root + "/tidal", "input_ids")
    if "parquet" in kind:
        source, column = root + "/parquet", "tokens"
    elif "megatron" in kind:
        source = root + "/megatron"
    elif "litdata" in kind:
        source = root + "/litdata"
    outputs = ("input_ids",) if kind.endswith("lean") else ("input_ids", "labels", "position_ids", "segment_ids")
    ds = tidal.Dataset(source).shuffle(seed=0).repeat().pack(2048, column=column, outputs=outputs).batch(8)
    loader = tidal.DataLoader(ds, num_workers=workers)
    def batches():
        yield from loader
    def finish(b):
        return b["input_ids"]
elif kind == "cache":
    import glob, os
    files = sorted(glob.glob(root + "/tidal/*.tokens"))
    def batches():
        while True:
            for f in files:
                with open(f, "rb") as fh:
                    while True:
                        chunk = fh.read(8 * 2049 * 2)
                        if not chunk:
                            break
                        yield chunk
    def finish(b):
        return b
else:
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader
    ds = StreamingDataset(root + "/litdata", item_loader=TokensLoader(block_size=2049), shuffle=True, drop_last=True)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, drop_last=True)
    def batches():
        while True:
            yield from loader
    if kind == "litdata+int64":
        def finish(b):
            return b[:, :-1].long(), b[:, 1:].long()
    else:
        def finish(b):
            return b
it = batches()
finish(next(it))
start = time.perf_counter(); n = 0
while time.perf_counter() - start < seconds:
    finish(next(it)); n += 1
print(json.dumps({"batches_per_s": n / (time.perf_counter() - start)}))
"""


def prepare(root: Path, tokens: int) -> None:
    import numpy as np

    done = root / "manifest.json"
    if done.exists() and json.loads(done.read_text()).get("tokens") == tokens and (root / "parquet").exists():
        return
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    from tidal.formats.tokens import TokenWriter

    rng = np.random.default_rng(1234)
    written = 0
    docs = []
    with TokenWriter(root / "tidal", dtype="uint16", shard_size=16 << 20) as writer:
        while written < tokens:
            n = int(np.clip(rng.lognormal(6.3, 1.0), 16, 60_000))
            docs.append(rng.integers(0, 32_000, n, dtype=np.uint16))
            writer.write(docs[-1])
            written += n
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "parquet").mkdir()
    step = len(docs) // 4 + 1  # the same documents as a Parquet list<uint16> column, 4 files
    for i in range(0, len(docs), step):
        table = pa.table({"tokens": pa.array(docs[i : i + step], type=pa.list_(pa.uint16()))})
        pq.write_table(table, root / "parquet" / f"part-{i // step}.parquet", row_group_size=4096)
    code = (
        "import glob, sys, numpy as np, litdata\n"
        "from litdata.streaming.item_loader import TokensLoader\n"
        "from tidal.formats.tokens import TokenShard\n"
        "def docs(path):\n"
        "    shard = TokenShard(path)\n"
        "    ids, off = shard.tokens(0, len(shard.offsets) - 1)\n"
        "    for a, z in zip(off[:-1], off[1:]):\n"
        "        yield np.asarray(ids[a:z])\n"
        "if __name__ == '__main__':\n"
        f"    files = sorted(glob.glob({str(root / 'tidal')!r} + '/*.tokens'))\n"
        f"    litdata.optimize(fn=docs, inputs=files, output_dir={str(root / 'litdata')!r}, "
        "chunk_size=2049 * 8000, num_workers=2, item_loader=TokensLoader())\n"
    )
    script = root / "make_litdata.py"
    script.write_text(code)
    subprocess.run([sys.executable, str(script)], check=True, capture_output=True)
    done.write_text(json.dumps({"tokens": tokens}))


def prepare_megatron(root: Path) -> None:
    """The same documents as Megatron-LM ``.bin``/``.idx`` pairs (4 of them, a sequence per
    document), written from the token shards by the documented MMIDIDX layout (version 1)."""
    import struct

    import numpy as np

    from tidal.formats.tokens import TokenShard

    out = root / "megatron"
    if out.exists():
        return
    docs = []
    for path in sorted(glob.glob(str(root / "tidal" / "*.tokens"))):
        shard = TokenShard(path)
        ids, off = shard.tokens(0, len(shard.offsets) - 1)
        docs += [np.asarray(ids[a:z], dtype=np.uint16) for a, z in itertools.pairwise(off.tolist())]
    tmp = root / "megatron.partial"
    tmp.mkdir(exist_ok=True)
    step = len(docs) // 4 + 1
    for i in range(0, len(docs), step):
        part = docs[i : i + step]
        lengths = np.array([len(d) for d in part], dtype="<i4")
        pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * 2)[:-1]]).astype("<i8")
        prefix = tmp / f"part-{i // step}"
        prefix.with_suffix(".bin").write_bytes(b"".join(d.tobytes() for d in part))
        head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(part), len(part) + 1)  # 8: uint16
        index = np.arange(len(part) + 1, dtype="<i8")
        prefix.with_suffix(".idx").write_bytes(head + lengths.tobytes() + pointers.tobytes() + index.tobytes())
    tmp.rename(out)


def measure(kind: str, workers: int, root: Path, seconds: float) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(workers), str(root), str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds * 10 + 120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} with {workers} workers failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["batches_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="bench-data/tokens")
    ap.add_argument("--tokens", type=int, default=40_000_000)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.seconds, args.repeats = 5_000_000, 2.0, 1
    root = Path(args.data).resolve()
    prepare(root, args.tokens)
    prepare_megatron(root)
    size = sum(os.path.getsize(f) for f in glob.glob(str(root / "tidal" / "*.tokens")))
    configs = [
        ("cache", 0),
        ("tidal", 0),
        ("tidal-lean", 0),
        ("tidal-parquet", 0),
        ("tidal-parquet-lean", 0),
        ("tidal-megatron", 0),
        ("tidal-megatron-lean", 0),
        ("tidal-litdata", 0),
        ("tidal-litdata-lean", 0),
        ("litdata", 0),
        ("litdata+int64", 0),
        ("tidal", 2),
        ("tidal-lean", 2),
        ("tidal-parquet-lean", 2),
        ("tidal-megatron-lean", 2),
        ("litdata", 2),
    ]
    results: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    load0 = os.getloadavg()[0]
    for _ in range(args.repeats):
        for kind, workers in configs:
            results[(kind, workers)].append(measure(kind, workers, root, args.seconds))
    load1 = os.getloadavg()[0]
    tokens = 8 * 2048
    med = {c: statistics.median(v) for c, v in results.items()}
    print(
        f"pre-tokenized packing, (8, 2048): {args.tokens / 1e6:.0f}M tokens in {size / 1e6:.0f} MB of uint16; "
        f"medians of {args.repeats}, {args.seconds:g} s each; load average {load0:.2f} -> {load1:.2f}"
    )
    print(f"{'configuration':<32}{'batches/s':>12}{'M tokens/s':>12}{'vs LitData':>12}{'vs page cache':>15}")
    cache = med[("cache", 0)] * 8 * 2049 * 2  # bytes/s
    for (kind, workers), value in med.items():
        if kind == "cache":
            print(f"{'page cache, the same bytes':<32}{'':>12}{cache / 2 / 1e6:>12.1f}{'':>12}{'1.00x':>15}")
            continue
        lit = med.get(("litdata", workers))
        ratio = f"{value / lit:.2f}x" if lit and kind.startswith("tidal") else ""  # vs LitData's raw uint16 windows
        share = f"{value * tokens * 2 / cache:.2f}x"
        name = f"{kind}, {workers} workers"
        print(f"{name:<32}{value:>12.0f}{value * tokens / 1e6:>12.1f}{ratio:>12}{share:>15}")


if __name__ == "__main__":
    main()
