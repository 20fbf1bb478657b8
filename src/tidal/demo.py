"""The demo: a sharded corpus made on this machine, streamed shuffled through 2 workers,
stopped mid-epoch, resumed in a new process from the saved state, and checked identical.

The corpus is the docstrings of Python's standard library, so it needs no network.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
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
BATCH = 16
SEED = 2026


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


def dataset(root: Path):  # -> tidal.Dataset
    import tidal

    return tidal.Dataset(root, columns=["id", "text"]).shuffle(seed=SEED).batch(BATCH)


def digest(batch: dict) -> str:
    return hashlib.sha1(json.dumps([batch["id"].tolist(), batch["text"]]).encode()).hexdigest()[:12]


def resume(root: Path, state_file: Path) -> None:
    """Run in a fresh process: restore the state and print the digests of the remaining batches."""
    import tidal

    loader = tidal.DataLoader(dataset(root), num_workers=2)
    loader.load_state_dict(json.loads(state_file.read_text()))
    print(json.dumps([digest(b) for b in loader]))


def main(root: str = "demo-data") -> int:
    from tqdm import tqdm

    import tidal

    base = Path(root).resolve()
    data = build(base / "docs")
    ds = dataset(data)
    print(f"corpus: {ds.num_records} docstrings of the standard library in {len(ds.shards)} shards at {data}")
    loader = tidal.DataLoader(ds, num_workers=2)
    full = [digest(b) for b in tqdm(loader, desc="full epoch (2 workers, shuffled)", unit="batch")]
    stop = len(full) // 2
    loader = tidal.DataLoader(ds, num_workers=2)
    for step, batch in enumerate(tqdm(loader, desc="interrupted run", unit="batch", total=len(full))):
        assert digest(batch) == full[step], "two runs with the same seed differ"
        if step + 1 == stop:
            state = loader.state_dict()
            break
    state_file = base / "state.json"
    state_file.write_text(json.dumps(state, indent=1))
    print(f"stopped after {stop} of {len(full)} batches; saved {len(json.dumps(state))} bytes of state to {state_file}")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-m", "tidal.demo", "--resume", str(data), str(state_file)],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    rest = json.loads(out.stdout.strip().splitlines()[-1])
    same = rest == full[stop:]
    verdict = "yes" if same else "NO"
    print(f"resumed in a new process: {len(rest)} more batches; identical to the uninterrupted run: {verdict}")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--resume":
        resume(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(main(*sys.argv[1:2]))
