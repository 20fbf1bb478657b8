"""An optional package that is missing, or a file that is not what a step needs, is an error that
says what to do: the ``pip install`` of the extra, or the file and what it is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import make_shards

import tidal


def test_a_missing_tokenizers_names_the_extra_that_installs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if it were not installed
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(tidal.MissingDependency, match=r"pip install 'tidal\[tokenize\]'") as err:
        tidal.Dataset(make_shards(tmp_path / "data", [3])).tokenize(tmp_path / "tokenizer.json")
    assert isinstance(err.value, ImportError) and isinstance(err.value, tidal.TidalError)


def test_a_missing_pyyaml_names_the_extra_that_installs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)
    (tmp_path / "pipeline.yaml").write_text("source: {src: data}\n")
    with pytest.raises(tidal.MissingDependency, match=r"YAML config needs .* pip install 'tidal\[cli\]'"):
        tidal.Dataset.from_config(tmp_path / "pipeline.yaml")


def test_a_file_that_is_not_a_tokenizer_is_named(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    (tmp_path / "pipeline.yaml").write_text("source: {src: data}\n")
    with pytest.raises(tidal.FormatError, match=r"pipeline.yaml: not a tokenizer.json that tokenizers reads"):
        tidal.Dataset(make_shards(tmp_path / "data", [3])).tokenize(tmp_path / "pipeline.yaml")
