"""Every code block of README.md and docs/*.md, run as written.

The blocks run in a fresh directory holding what the examples name: ``data/web`` (three
shards of JSON lines, 750 records of ``{"id", "text"}``), ``tokenizer.json`` (a small
byte-level BPE) and, for the command line, ``data_state.json`` (a loader state) and
``pipeline.yaml``; for blocks that name ``run/``, the states of a short run and its pipeline
(docs/debugging.md).

- ```` ```python ```` blocks are executed, each in a namespace of its own.
- ```` ```bash ```` blocks of ``tidal ...`` commands are run, each command as
  ``python -m tidal.cli ...``, and must exit 0. A bash block that cannot run here (it needs S3,
  several processes, a Ray cluster) starts with a ``# not run: <why>`` line, and is reported as
  skipped with that reason; blocks of ``make`` targets are the test suite itself and are skipped.
- ```` ```text ```` blocks (printed output, the peers' code, examples that need a remote store)
  and ```` ```yaml ```` blocks are shown, not run.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_shards
from makers import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
NOT_RUN = "# not run:"

# Lightning (the metrics page's example) calls a torch pytree API that torch deprecates: theirs to fix
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")


def blocks(kind: str) -> list[tuple[str, str]]:
    """``(name, code)`` of every block of ``kind`` in the pages, named ``page:line``."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == kind:
                line = text[: m.start()].count("\n") + 1
                out.append((f"{page.relative_to(ROOT)}:{line}", m.group(2)))
    return out


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    make_shards(tmp_path / "data" / "web", [300, 200, 250], kinds=("jsonl.zst",))
    train_tokenizer(tmp_path / "tokenizer.json")
    monkeypatch.chdir(tmp_path)
    return tmp_path


PYTHON = blocks("python")
BASH = blocks("bash")


def test_the_pages_have_blocks_and_every_fence_is_closed() -> None:
    assert len(PYTHON) >= 20 and len(BASH) >= 8
    for page in PAGES:
        assert page.read_text().count("```") % 2 == 0, f"{page}: an unclosed code fence"
    kinds = {m.group(1) for page in PAGES for m in FENCE.finditer(page.read_text())}
    assert kinds <= {"python", "bash", "text", "yaml"}, kinds


@pytest.mark.parametrize("code", [c for _, c in PYTHON], ids=[n for n, _ in PYTHON])
def test_python_block_runs(workdir: Path, code: str, request: pytest.FixtureRequest) -> None:
    if "run/" in code:
        _run_states(workdir)
    try:
        exec(compile(code, request.node.callspec.id, "exec"), {"__name__": "__docs__"})
    finally:
        if "accelerate.state" in sys.modules:  # an example set up an Accelerator: leave none behind
            sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)


def commands(code: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


@pytest.mark.parametrize("code", [c for _, c in BASH], ids=[n for n, _ in BASH])
def test_bash_block_runs(workdir: Path, code: str) -> None:
    if code.startswith(NOT_RUN):
        reason = code.splitlines()[0][len(NOT_RUN) :].strip()
        assert reason, "say why the block is not run"
        pytest.skip(f"not run: {reason}")
    lines = commands(code)
    if all(line.startswith("make ") for line in lines):
        pytest.skip("make targets: the test suite itself")
    _state_and_config(workdir)
    if "run/" in code:
        _run_states(workdir)
    for line in lines:
        args = shlex.split(line, comments=True)
        assert args[0] == "tidal", f"{line!r}: a bash block runs tidal commands, or starts with '{NOT_RUN} <why>'"
        out = subprocess.run(
            [sys.executable, "-m", "tidal.cli", *args[1:]], cwd=workdir, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, f"{line}\n{out.stdout}\n{out.stderr}"


def _state_and_config(root: Path) -> None:
    """What the command-line examples name besides the data: a saved loader state and a pipeline config."""
    import tidal

    ds = tidal.Dataset(root / "data" / "web", columns=["text"]).shuffle(seed=0).repeat().batch(8)
    loader = tidal.DataLoader(ds)
    list(itertools.islice(loader, 20))
    (root / "data_state.json").write_text(json.dumps(loader.state_dict()))
    (root / "pipeline.yaml").write_text(
        "source: {src: data/web, columns: [text]}\n"
        "steps: [{shuffle: {seed: 0}}, repeat, {tokenize: {tokenizer: tokenizer.json}}, {pack: {seq_len: 128}}, {batch: {size: 8}}]\n"
    )


def _run_states(root: Path) -> None:
    """What docs/debugging.md's commands name: the states of a run after 10, 20 and 30 batches
    of a packed pipeline, and the pipeline, in ``run/``."""
    import tidal

    ds = tidal.Dataset("data/web", columns=["text"]).shuffle(seed=0).repeat().tokenize("tokenizer.json")
    ds = ds.pack(seq_len=128).batch(8)  # as the page's run: paths relative to the working directory
    (root / "run").mkdir(exist_ok=True)
    (root / "run" / "pipeline.json").write_text(json.dumps(ds.to_config()))
    loader = tidal.DataLoader(ds, num_workers=2)
    for step, _ in enumerate(itertools.islice(loader, 30), 1):
        if step % 10 == 0:
            (root / "run" / f"state-{step}.json").write_text(json.dumps(loader.state_dict()))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_leads_to_a_file_and_heading() -> None:
    for page in PAGES:
        text = FENCE.sub("", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            assert where.exists(), f"{page.name}: {target} leads nowhere"
            if anchor and where.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", FENCE.sub("", where.read_text()), flags=re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{page.name}: no heading #{anchor} in {where.name}"
