"""An optional package that is missing, or a file that is not what a step needs, is an error that
says what to do: the ``pip install`` of the extra, or the file and what it is not."""

from __future__ import annotations

import subprocess
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


# -- every entry point of an optional package, with the package made unimportable ---------------

ENTRY_POINTS = [
    # (what is blocked, the code a user runs, the pip install the error names)
    ("torch", "tidal.DataLoader(ds)", "pip install 'tidal[torch]'"),
    ("torch", "from tidal import DataLoader", "pip install 'tidal[torch]'"),
    ("transformers", "import tidal.hf", "pip install 'tidal[hf]'"),
    ("transformers", "tidal.integrations.hf.attach", "pip install 'tidal[hf]'"),
    ("transformers", "from tidal.integrations.hf import MetricsCallback", "pip install 'tidal[hf]'"),
    ("lightning", "tidal.integrations.lightning.MetricsCallback()", "pip install 'tidal[lightning]'"),
    ("torch", "tidal.integrations.lightning.MetricsCallback()", "pip install 'tidal[torch]'"),
    ("jax", "tidal.jax.Loader(ds)", "pip install 'tidal[jax]'"),
    ("jax", "import tidal.jax", "pip install 'tidal[jax]'"),
    ("prometheus_client", "tidal.integrations.prometheus.serve", "pip install 'tidal[prometheus]'"),
    ("ray", "tidal.convert.engines.run_ray(None, [1], 1, None, None)", "pip install 'tidal[ray]'"),
    ("ray", "tidal.ray.DataLoader(ds, readers=2)", "pip install 'tidal[ray]'"),
    ("ray", "from tidal.ray import DataLoader", "pip install 'tidal[ray]'"),
    ("tqdm", "tidal.Dataset(ds.sources()[''].shards.paths, progress=True)", "pip install 'tidal[cli]'"),
]


@pytest.mark.parametrize(("blocked", "code", "install"), ENTRY_POINTS, ids=[c for _, c, _ in ENTRY_POINTS])
def test_each_entry_point_of_an_optional_package_names_its_pip_install(
    tmp_path: Path, blocked: str, code: str, install: str
) -> None:
    """In a fresh process where ``blocked`` cannot be imported (as if not installed): the entry
    point raises tidal.MissingDependency naming the package and the ``pip install``, never a raw
    ModuleNotFoundError."""
    root = make_shards(tmp_path / "data", [3])
    script = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"  # any import of it now fails, as where it is not installed
        "import tidal, tidal.integrations, tidal.convert.engines\n"
        f"ds = tidal.Dataset({str(root)!r}).batch(2)\n"
        "try:\n"
        f"    {code}\n"
        "except tidal.MissingDependency as exc:\n"
        "    print(type(exc).__name__, isinstance(exc, ImportError), exc)\n"
        "except BaseException as exc:\n"
        "    print('other', type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingDependency True "), out.stdout
    assert f"the {blocked} package, which is not installed: {install}" in out.stdout, out.stdout


def test_a_package_installed_but_broken_is_not_called_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a package imports failing is said as such (reinstalling the extra is still the way)."""
    from tidal.errors import missing

    broken = ModuleNotFoundError("No module named 'torchvision'", name="torchvision")
    error = missing("transformers", "tidal.hf", broken, "hf")
    assert "installed but does not import (ModuleNotFoundError: No module named 'torchvision')" in str(error)
    assert str(error).endswith("pip install 'tidal[hf]'")


def test_a_remote_url_without_its_filesystem_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """s3:// without s3fs (nor obstore): MissingDependency, not retried as a store's error nor
    wrapped in a StorageError."""
    from tidal.storage import clients

    for name in ("s3fs", "obstore", "obstore.fsspec"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(clients._TidalS3, "_cls", None)  # as on a machine where s3fs was never imported
    with pytest.raises(
        tidal.MissingDependency, match=r"s3fs package, which is not installed: pip install 'tidal\[s3\]'"
    ):
        tidal.Dataset("s3://no-bucket/data/", storage_options={"anon": True})


def test_a_codec_not_installed_is_missing_not_bad_data(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidal.formats import codecs

    monkeypatch.setitem(sys.modules, "brotli", None)
    with pytest.raises(tidal.MissingDependency, match=r"reading brotli files \(a\.mds\.br\).*pip install brotli"):
        codecs.decompress("a.mds.br", b"\x00", "brotli")


def test_errors_skip_does_not_skip_what_a_missing_package_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MDS images decoded with decode_images=True need Pillow: without it, errors="skip" must not
    drop every record as bad data."""
    from conftest import mds_writer

    image = pytest.importorskip("PIL.Image")
    picture = image.new("RGB", (4, 3), (10, 20, 30))
    with mds_writer()(out=str(tmp_path / "mds"), columns={"png": "png"}, size_limit=1 << 20) as writer:
        for _ in range(3):
            writer.write({"png": picture})
    ds = tidal.Dataset(tmp_path / "mds", errors="skip", format_options={"decode_images": True})
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(tidal.MissingDependency, match=r"decode_images=True needs the PIL package.*pip install pillow"):
        list(ds)


def test_progress_asked_for_without_tqdm_names_the_extra(tmp_path: Path) -> None:
    """--progress is a bar asked for: without tqdm to draw it, an error, not a silent nothing."""
    root = make_shards(tmp_path / "data", [3])
    script = (
        "import sys\n"
        "sys.modules['tqdm'] = None\n"
        "from tidal.cli import main\n"
        f"print(main(['inspect', {str(root)!r}]), main(['inspect', {str(root)!r}, '--progress']))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[-1] == "0 2", out
    assert (
        "tidal inspect: --progress needs the tqdm package, which is not installed: pip install 'tidal[cli]'"
        in out.stderr
    )
