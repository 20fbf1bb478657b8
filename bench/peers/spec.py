"""One measurement of the peers' benchmark, as the driver hands it to a child process."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Spec:
    """One measurement, run in a child process (``--child SPEC``)."""

    kind: str  # text | tokens | raw | import | cache | resume-save | resume-load
    loader: str = ""
    root: str = ""  # the directory of the loader's format (cache: the corpus directory)
    workers: int = 0
    batch: int = 8
    seconds: float = 0.0
    seed: int = 1
    tokenizer: str = ""
    seq_len: int = 2048
    threads: int = 0  # RAYON_NUM_THREADS in the child's environment; 0 leaves it unset
    raw_mb: float = 20.0
    method: str = "encode_batch"  # raw: which tokenizers method
    records: int = 0  # records of one epoch
    fractions: tuple[float, ...] = ()
    at: float = 0.0
    state_file: str = ""
    t_spawn: float = 0.0  # wall clock in the parent just before the child was started
    # the s3 workload: the URL of the loader's copy on the server (set: read from there, not from ``root``), the
    # server's endpoint, and a fresh, empty local directory for every cache the loader keeps
    url: str = ""
    endpoint: str = ""
    cache: str = ""
