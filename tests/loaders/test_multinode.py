"""Several nodes on one machine: two torchrun launchers on 127.0.0.1 (``--nnodes 2``), 2 ranks
x 2 DataLoader workers each, one shard cache per node, reading from a real S3 server.

Each node reaches S3 through a proxy of its own that records every request, so the test knows
what each node downloaded. Then:

- every record of the epoch is read once, and each shard is downloaded at most once per node;
- ``tidal plan``'s predicted bytes per node are within 10% of what each node downloaded;
- a node killed with SIGKILL mid-epoch, and the job resumed on one node from the last saved
  state, loses and repeats nothing.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import procs
import pytest
import zstandard
from fault_proxy import FaultProxy, Requests

import tidal

pytestmark = pytest.mark.slow
pytest_plugins = ["s3_fixtures"]

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_nodes.py"
SHARDS, PER_SHARD = 24, 40
SETUP = {"seed": 3, "block_size": 80, "shards_per_block": 2, "batch": 8, "workers": 2}


def corpus(root: Path) -> Path:
    root.mkdir()
    for k in range(SHARDS):
        lines = "".join(
            json.dumps({"id": k * PER_SHARD + i, "text": "z" * (50 + k * 7)}) + "\n" for i in range(PER_SHARD)
        )
        (root / f"part-{k:03d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    return root


def launcher(node: int, nodes: int, port: int, config: Path) -> procs.Command:
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nodes), "--node-rank", str(node), "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port),
        str(SCRIPT), str(config),
    ]  # fmt: skip
    return procs.Command(f"node {node}", argv, procs.child_env())


def write_config(tmp_path: Path, name: str, nodes: list[dict], **extra: Any) -> Path:
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({"name": name, "out": str(tmp_path / "out"), "nodes": nodes, **SETUP, **extra}))
    return config


def consumed(out: Path, name: str, ranks: int) -> list[list[list[int]]]:
    return [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(ranks)]


def planned_bytes(url: str, options: dict, cache: Path) -> list[float]:
    """Bytes per node that ``tidal plan`` predicts for this job's topology."""
    from tidal.cli import main

    argv = ["plan", url, "--ranks", "4", "--ranks-per-node", "2", "--workers", "2", "--shuffle", "3"]
    argv += ["--block-size", "80", "--shards-per-block", "2", "--batch", "8", "--cache-dir", str(cache)]
    for k, v in options.items():
        argv += ["--storage-option", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(argv) == 0
    units = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
    found = re.findall(r"node (\d+) \(ranks [^)]*\): \d+ shards?, ([\d.]+) (B|kB|MB|GB)", text.getvalue())
    assert len(found) == 2, text.getvalue()
    return [float(n) * units[u] for _, n, u in sorted(found)]


def test_two_nodes_read_each_record_once_download_each_shard_once_and_resume_after_a_kill(
    s3: Any, bucket: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    data = corpus(tmp_path / "data")
    url = s3.upload(data, bucket, "web")
    tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "indexer")  # the job opens it from one GET
    (tmp_path / "out").mkdir()
    logs = [Requests(), Requests()]
    with (
        FaultProxy(("127.0.0.1", s3.port), every=0, only=logs[0]) as p0,
        FaultProxy(("127.0.0.1", s3.port), every=0, only=logs[1]) as p1,
    ):
        nodes = [
            {"storage_options": s3.options(p.endpoint), "cache_dir": str(tmp_path / f"node{n}")}
            for n, p in enumerate((p0, p1))
        ]
        # a whole epoch on two nodes
        config = write_config(tmp_path, "full", nodes, url=url, save_every=1000)
        port = procs.free_port()
        procs.run([launcher(n, 2, port, config) for n in range(2)], timeout=240)
        batches = consumed(tmp_path / "out", "full", 4)
        ids = [i for rank in batches for b in rank for i in b]
        total = SHARDS * PER_SHARD
        assert len(ids) == len(set(ids)) == total  # 960 records over 8 readers: none left over
        for n, log in enumerate(logs):
            downloads = [p for p, r in log.gets(".jsonl.zst") if r is None or r.startswith("bytes=0-")]
            assert len(downloads) == len(set(downloads)) > 0, f"node {n} downloaded a shard twice"
        measured = [_cached(tmp_path / f"node{n}") for n in range(2)]
        predicted = planned_bytes(url, s3.options(), tmp_path / "planner")
        for n in range(2):
            assert abs(measured[n] - predicted[n]) <= 0.1 * predicted[n], (measured, predicted)

        # the same epoch again, node 1 killed mid-epoch, then resumed on one node
        config = write_config(tmp_path, "killed", nodes, url=url, save_every=5, sleep=0.2)
        port = procs.free_port()
        with procs.Tree([launcher(0, 2, port, config)]) as node0, procs.Tree([launcher(1, 2, port, config)]) as node1:
            deadline = time.monotonic() + 180
            while not (tmp_path / "out" / "killed-state-10.json").exists():
                alive = all(p.poll() is None for p in node0.procs + node1.procs)
                assert time.monotonic() < deadline and alive, node0.report() + node1.report()
                time.sleep(0.1)
            procs.kill_tree(node1.mark)  # SIGKILL, the launcher and its ranks and their workers at once
        # node 0 is left waiting on node 1 in a collective: the job is over, and leaving the tree killed it
        states = sorted((tmp_path / "out").glob("killed-state-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        last = states[-1]
        step = int(last.stem.rsplit("-", 1)[1])
        before = [i for rank in consumed(tmp_path / "out", "killed", 4) for b in rank[:step] for i in b]
        resume = write_config(tmp_path, "resumed", nodes[:1], url=url, save_every=1000, resume=str(last))
        procs.run([launcher(0, 1, procs.free_port(), resume)], timeout=240)
        after = [i for rank in consumed(tmp_path / "out", "resumed", 2) for b in rank for i in b]
        assert len(before) + len(after) == len(set(before) | set(after))  # nothing read twice
        missing = set(range(total)) - set(before) - set(after)
        assert len(missing) < 4  # what 4 new readers cannot split evenly of what was left (none here, or a few)


def _cached(cache: Path) -> int:
    return sum(p.stat().st_size for p in (cache / "shards").glob("*.shard"))
