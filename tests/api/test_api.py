"""The public surface: names and import cost. (The examples of the README and docs/ run in test_docs.py.)

The names below are written out so that a change to the surface is made on purpose: a name added
to (or dropped from) ``tidal`` or a documented submodule fails here until the list says so too.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_shards

import tidal

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(tidal.__file__).resolve().parent

PUBLIC = [
    "ArgumentError",
    "ConfigError",
    "Cosine",
    "DataLoader",
    "Dataset",
    "FormatError",
    "Linear",
    "MissingDependency",
    "Piecewise",
    "RecordError",
    "SchemaError",
    "Shard",
    "Shards",
    "SourceError",
    "StateError",
    "StorageError",
    "TidalError",
    "Untraceable",
    "World",
    "index",
    "mix",
    "trace",
]

# The submodules the README and docs/ name, and their public names: ``__all__`` where the module
# has one, else its top-level functions and classes. Read from the source, so that neither JAX
# nor transformers is imported here.
SUBMODULES = {
    "tidal.state": ["View", "check_int", "merge", "show", "skip"],
    "tidal.testing": ["assert_partition_exact", "assert_resumes_exactly", "read_partitioned", "same"],
    "tidal.convert": ["Job", "Report", "convert", "cut", "run_task"],
    "tidal.storage": ["Retry", "Storage", "is_remote", "parse_size"],
    "tidal.jax": ["Loader", "data_sharding"],
    "tidal.ray": ["DataLoader"],
    "tidal.hf": ["TidalTrainer", "state_file"],
    "tidal.sources": ["Resolved", "resolve_source", "storage_settings"],
    "tidal.integrations": ["hf", "lightning", "prometheus"],
    "tidal.integrations.hf": ["MetricsCallback", "attach"],
    "tidal.integrations.lightning": ["MetricsCallback"],
    "tidal.integrations.prometheus": ["Server", "collector", "serve"],
    "tidal.provenance": ["Replay", "Segment", "Step", "load_state", "trace", "traced"],
    "tidal.verify": ["Report", "verify"],
}

# Single names the docs point at inside other modules.
DOCUMENTED = ["tidal.formats.tokens.TokenWriter", "tidal.sources.index_file.index_json"]

# What ``import tidal`` must not import: the optional extras and what a plain read never needs
# (torch is imported by tidal.DataLoader, JAX by tidal.jax, the rest by the features that use them).
NOT_ON_IMPORT = [
    "adlfs",
    "datasets",
    "fsspec",
    "gcsfs",
    "huggingface_hub",
    "jax",
    "lightning",
    "matplotlib",
    "obstore",
    "pandas",
    "PIL",
    "prometheus_client",
    "pyarrow.csv",
    "pyarrow.dataset",
    "pyarrow.parquet",
    "pytorch_lightning",
    "ray",
    "s3fs",
    "tokenizers",
    "torch",
    "tqdm",
    "transformers",
    "yaml",
]


def test_all_is_sorted_and_complete() -> None:
    assert tidal.__all__ == sorted(tidal.__all__)
    for name in tidal.__all__:
        assert getattr(tidal, name) is not None
    assert {"Dataset", "DataLoader"} <= set(tidal.__all__)


def test_the_public_names_are_the_written_ones() -> None:
    assert tidal.__all__ == PUBLIC


def _public_names(module: str) -> list[str]:
    """``__all__`` of ``module``'s source, else its top-level public functions and classes."""
    path = SRC.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return sorted(ast.literal_eval(node.value))
    defined = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return sorted(n.name for n in tree.body if isinstance(n, defined) and not n.name.startswith("_"))


@pytest.mark.parametrize("module", sorted(SUBMODULES))
def test_the_documented_submodules_public_names_are_the_written_ones(module: str) -> None:
    assert _public_names(module) == SUBMODULES[module]


@pytest.mark.parametrize(
    "module",
    [
        "tidal.state",
        "tidal.testing",
        "tidal.convert",
        "tidal.storage",
        "tidal.sources",
        "tidal.provenance",
        "tidal.verify",
    ],
)
def test_each_public_name_of_a_submodule_is_there(module: str) -> None:
    imported = importlib.import_module(module)
    for name in SUBMODULES[module]:
        assert getattr(imported, name) is not None


@pytest.mark.parametrize("dotted", DOCUMENTED)
def test_the_names_the_docs_point_at_are_there(dotted: str) -> None:
    module, name = dotted.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is not None


def test_import_does_not_pull_in_torch_jax_or_the_extras() -> None:
    code = f"import sys, tidal; print(' '.join(m for m in {NOT_ON_IMPORT!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_import_tidal_ray_needs_neither_ray_nor_torch() -> None:
    """``import tidal.ray`` is cheap and always works; its DataLoader imports torch and Ray."""
    code = (
        "import sys; sys.modules['ray'] = None; sys.modules['torch'] = None\n"
        "import tidal.ray\n"
        "print(tidal.ray.__all__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "['DataLoader']", out.stderr


def test_plain_iteration_works_without_torch(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [10, 20])
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails
        "import tidal\n"
        f"ds = tidal.Dataset({str(root)!r}).shuffle(seed=1).batch(5)\n"
        "print(sum(len(b['id']) for b in ds))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "30"


def test_reading_shuffled_batches_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas on the first ``pa.array()`` or ``to_numpy()``: 0.3 s and 40 MB in
    every DataLoader worker before its first batch. tidal's read path calls neither."""
    root = make_shards(tmp_path / "data", [30, 20, 25], kinds=("parquet",))
    code = (
        "import sys, tidal\n"
        f"ds = tidal.Dataset({str(root)!r}).shuffle(seed=1, block_size=16).batch(5)\n"
        "print(sum(len(b['id']) for b in ds), 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["75", "False"], out.stderr
