"""Declarative pipelines: every chain written as a config and read back is the same dataset."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import fsspec
import pytest
import yaml
from conftest import make_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from makers import train_tokenizer, word_tokenizer

import tidal
from tidal.cli import main
from tidal.storage.config import public_source
from tidal.testing import same


def add_length(record: dict) -> dict:
    return {**record, "length": len(record["text"])}


def is_even(record: dict) -> bool:
    return record["id"] % 2 == 0


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config")
    make_shards(root / "web", [40, 75, 13, 60, 52])
    make_shards(root / "code", [30, 20], kinds=("jsonl",))
    train_tokenizer(root / "tokenizer.json")
    return root


def round_trip(ds: tidal.Dataset, items: int = 6) -> dict:
    """Write ``ds`` as JSON, read it back: the same fingerprint and the same first items."""
    config = json.loads(json.dumps(ds.to_config()))
    again = tidal.Dataset.from_config(config)
    assert again.fingerprint() == ds.fingerprint()
    assert repr(again) == repr(ds)
    for a, b in zip(itertools.islice(ds, items), itertools.islice(again, items), strict=True):
        assert same(a, b)
    return config


def chains(data: Path) -> dict[str, tidal.Dataset]:
    web = tidal.Dataset(data / "web", columns=["id", "text"])
    tok = str(data / "tokenizer.json")
    return {
        "plain": web.batch(4, drop_last=False),
        "shuffled": web.shuffle(seed=3, block_size=32, shards_per_block=2).repeat(2).batch(5),
        "map_filter": web.map(add_length).filter(is_even).repeat(),
        "tokenize_path": web.shuffle(seed=1).repeat().tokenize(tok, max_length=6).pack(16, "best_fit", buffer_size=4),
        "tokenize_object": web.tokenize(word_tokenizer(), eos="<eos>").pack(
            8, shift_labels=False, mask_boundaries=True
        ),
        "continuous": web.repeat().tokenize(tok).pack(12).batch(4, continuous=True),
        "pretokenized_pack": web.tokenize(tok, eos=False).pack(8, eos=3, pad_id=1),
        "format_options": tidal.Dataset(data / "code", format="jsonl", errors="skip", format_options={}).batch(2),
        "list_src": tidal.Dataset([data / "code" / "part-000.jsonl", data / "web"]).shuffle(seed=0).repeat(3),
    }


KINDS = ["plain", "shuffled", "map_filter", "tokenize_path", "tokenize_object", "continuous", "pretokenized_pack",
         "format_options", "list_src"]  # fmt: skip


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_of_step_round_trips(data: Path, name: str) -> None:
    config = round_trip(chains(data)[name])
    assert config["version"] == 1 and "source" in config


def test_the_config_reads_as_it_was_written(data: Path) -> None:
    config = chains(data)["continuous"].to_config()
    assert config["source"] == {
        "src": str(data / "web"),
        "columns": ["id", "text"],
        "errors": "raise",
        "follow_links": False,
    }
    assert [next(iter(s)) for s in config["steps"]] == ["repeat", "tokenize", "pack", "batch"]
    assert config["steps"][1]["tokenize"] == {"tokenizer": str(data / "tokenizer.json"), "column": "text", "eos": 0}
    assert config["steps"][3] == {"batch": {"size": 4, "continuous": True}}
    assert chains(data)["map_filter"].to_config()["steps"][1] == {"map": {"fn": "test_config:add_length"}}


WEIGHTS: dict[str, dict[str, Any]] = {
    "weights": {"weights": {"web": 0.7, "code": 0.3}, "stop": "all_exhausted"},
    "linear": {
        "weights": tidal.Linear({"web": 0.9, "code": 0.1}, {"web": 0.5, "code": 0.5}, steps=50),
        "stop": "never",
    },
    "cosine": {
        "weights": tidal.Cosine({"web": 0.2, "code": 0.8}, {"web": 0.8, "code": 0.2}, steps=80),
        "stop": "never",
    },
    "piecewise": {"weights": tidal.Piecewise([(0, {"web": 1.0, "code": 0.0}), (40, {"web": 0.5, "code": 0.5})])},
    "choose": {"choose": {"code": 30}, "stop": "all_exhausted"},
    "repeat": {"repeat": {"web": 0.5, "code": 2.0}},
    "epoch_size": {"weights": [1.0, 3.0], "epoch_size": 90, "stop": "first_exhausted"},
}


@pytest.mark.parametrize("kind", list(WEIGHTS))
def test_mixtures_round_trip_with_weights_schedules_and_counts(data: Path, kind: str) -> None:
    web = tidal.Dataset(data / "web", columns=["text"]).shuffle(seed=1, block_size=16).repeat()
    code = tidal.Dataset(data / "code", columns=["text"]).repeat(2)
    mixed = tidal.mix({"web": web, "code": code}, seed=7, **WEIGHTS[kind])
    config = round_trip(mixed.tokenize(str(data / "tokenizer.json")).pack(16).batch(2), items=8)
    assert set(config["mix"]["streams"]) == {"web", "code"} and config["mix"]["seed"] == 7


def test_a_mixture_of_mixtures_round_trips(data: Path) -> None:
    web = tidal.Dataset(data / "web", columns=["text"]).repeat()
    code = tidal.Dataset(data / "code", columns=["text"]).repeat()
    inner = tidal.mix([web, code], seed=1, stop="never")
    round_trip(tidal.mix({"inner": inner, "web": web}, weights={"inner": 1, "web": 2}, stop="never").batch(3))


def test_yaml_toml_and_json_files_build_the_same_dataset(data: Path, tmp_path: Path) -> None:
    ds = tidal.Dataset(data / "web", columns=["text"]).shuffle(seed=2).repeat().tokenize(str(data / "tokenizer.json"))
    ds = ds.pack(32).batch(2)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(ds.to_config(), sort_keys=False))
    (tmp_path / "p.json").write_text(json.dumps(ds.to_config()))
    (tmp_path / "p.toml").write_text(
        f"""
        [source]
        src = "{data / "web"}"
        columns = ["text"]

        [[steps]]
        shuffle = {{seed = 2}}
        [[steps]]
        repeat = {{}}
        [[steps]]
        tokenize = {{tokenizer = "{data / "tokenizer.json"}"}}
        [[steps]]
        pack = {{seq_len = 32}}
        [[steps]]
        batch = {{size = 2}}
        """
    )
    for name in ("p.yaml", "p.json", "p.toml"):
        assert tidal.Dataset.from_config(tmp_path / name).fingerprint() == ds.fingerprint(), name
    (tmp_path / "p.txt").write_text("{}")
    with pytest.raises(tidal.ConfigError, match=r"ends in \.json, \.yaml, \.yml or \.toml"):
        tidal.Dataset.from_config(tmp_path / "p.txt")
    (tmp_path / "bad.yaml").write_text("source: [unclosed")
    with pytest.raises(tidal.ConfigError, match=r"bad\.yaml"):
        tidal.Dataset.from_config(tmp_path / "bad.yaml")


def rich(data: Path) -> dict:
    ds = tidal.Dataset(data / "web", columns=["text"]).shuffle(seed=1).repeat()
    config = ds.tokenize(str(data / "tokenizer.json")).pack(64).batch(8).to_config()
    config["loader"] = {"num_workers": 0}
    return config


def mixed(data: Path) -> dict:
    web = tidal.Dataset(data / "web", columns=["text"]).repeat()
    weights = tidal.Linear({"web": 1.0, "code": 0.0}, {"web": 0.5, "code": 0.5}, steps=10)
    return tidal.mix({"web": web, "code": web}, weights=weights, stop="never").to_config()


def put(config: dict, path: list, key: str, value: Any = 1) -> dict:
    out = copy.deepcopy(config)
    at = out
    for part in path:
        at = at[part]
    at[key] = value
    return out


MISSPELT = [  # (config maker, where, the misspelt key, the error)
    (rich, ["steps", 3, "pack"], "seq_lenn", r"config\['steps'\]\[3\]\['pack'\]\['seq_lenn'\]: unknown key; known: seq_len, strategy"),
    (rich, ["source"], "colums", r"config\['source'\]\['colums'\]: unknown key; .*did you mean 'columns'"),
    (rich, ["steps", 0, "shuffle"], "blocksize", r"\['steps'\]\[0\]\['shuffle'\]\['blocksize'\]: unknown key"),
    (rich, ["steps", 4, "batch"], "continous", r"\['batch'\]\['continous'\]: unknown key; .*did you mean 'continuous'"),
    (rich, ["steps", 2, "tokenize"], "eso", r"\['steps'\]\[2\]\['tokenize'\]\['eso'\]: unknown key"),
    (rich, ["loader"], "num_worker", r"config\['loader'\]\['num_worker'\]: unknown key; .*did you mean 'num_workers'"),
    (rich, [], "step", r"config\['step'\]: unknown key; known: version, source, mix, steps, loader"),
    (mixed, ["mix"], "wieghts", r"config\['mix'\]\['wieghts'\]: unknown key; .*did you mean 'weights'"),
    (mixed, ["mix", "weights", "linear"], "stpes", r"\['weights'\]\['linear'\]\['stpes'\]: unknown key"),
    (mixed, ["mix", "streams", "web"], "sorce", r"config\['mix'\]\['streams'\]\['web'\]\['sorce'\]: unknown key"),
    (mixed, ["mix", "streams", "code", "steps", 0, "repeat"], "epoch", r"\['code'\]\['steps'\]\[0\]\['repeat'\]\['epoch'\]"),
]  # fmt: skip


@pytest.mark.parametrize("make,path,key,error", MISSPELT, ids=[m[2] for m in MISSPELT])
def test_each_misspelt_key_is_named(data: Path, make, path: list, key: str, error: str) -> None:
    config = put(make(data), path, key)
    with pytest.raises(tidal.ConfigError, match=error):
        tidal.Dataset.from_config(config)


def test_malformed_configs_say_where(data: Path) -> None:
    config = rich(data)
    cases = [
        ({**config, "steps": [{"pak": {"seq_len": 8}}]}, r"config\['steps'\]\[0\]: unknown step 'pak'.*did you mean 'pack'"),
        ({**config, "steps": [{"pack": {}}]}, r"config\['steps'\]\[0\]\['pack'\]\['seq_len'\] is missing"),
        ({**config, "steps": [{"pack": {"seq_len": 0}}]}, r"config\['steps'\]\[0\]\['pack'\]: seq_len .* at least 1"),
        ({**config, "steps": [{"map": {"fn": "nowhere.at_all:fn"}}]}, r"\['map'\]\['fn'\]: 'nowhere.at_all:fn' does not import"),
        ({**config, "steps": [{"map": {"fn": "add_length"}}]}, r"\['fn'\]: expected an import path 'package.module:function'"),
        ({**config, "steps": {"batch": {"size": 2}}}, r"config\['steps'\]: expected a list of steps"),
        ({**config, "steps": [{"batch": {"size": 2}, "repeat": {}}]}, r"config\['steps'\]\[0\]: a step is one method"),
        ({"steps": []}, r"config: give either 'source' \(files\) or 'mix'"),
        ({"source": {"columns": ["text"]}}, r"config\['source'\]\['src'\] is missing"),
        ({"version": 2, "source": config["source"]}, r"config\['version'\]: version 2 is not 1"),
        ({"mix": {"streams": {"a": {"source": config["source"]}}, "weights": {"linear": {"start": {}}}}},
         r"config\['mix'\]\['weights'\]\['linear'\]\['end'\] is missing"),
        ({"mix": {"streams": {"a": {"source": config["source"]}}, "stop": "sometimes"}}, r"config\['mix'\]: stop must be one of"),
    ]  # fmt: skip
    for bad, error in cases:
        with pytest.raises(tidal.ConfigError, match=error):
            tidal.Dataset.from_config(bad)
    steps = {**config, "steps": ["repeat", {"batch": {"size": 2, "drop_last": None}}]}  # a name alone; null: default
    assert repr(tidal.Dataset.from_config(steps)).endswith(".repeat(None).batch(2, drop_last=True)")


def test_what_has_no_import_path_is_named(data: Path) -> None:
    web = tidal.Dataset(data / "web")

    def local(record: dict) -> dict:
        return record

    with pytest.raises(tidal.ConfigError, match=r"map\(.*<lambda>\): .*\(a lambda\) has none"):
        web.map(lambda r: r).to_config()
    with pytest.raises(tidal.ConfigError, match=r"filter\(.*local\): .*\(a local function\) has none"):
        web.filter(local).to_config()

    class Slow:  # a tokenizer without a fast backend
        def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict:
            return {"input_ids": [[1] for _ in texts]}

        def __len__(self) -> int:
            return 10

    with pytest.raises(tidal.ConfigError, match=r"without a fast .* pass tokenize\(\) the path"):
        web.tokenize(Slow(), eos=2).to_config()


def test_credentials_never_reach_the_config(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/tidal-config-test/a.jsonl", b"".join(json.dumps({"id": i}).encode() + b"\n" for i in range(10)))
    options = {
        "key": "AKIAEXAMPLE",
        "secret": "s3cr3t-value",
        "token": "t0ken-value",
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": "another-s3cr3t"},
        "headers": {"Authorization": "Bearer b3arer", "User-Agent": "tidal"},
        "password": "hunter2",
    }
    ds = tidal.Dataset("memory://tidal-config-test", storage_options=options, cache_dir=tmp_path / "cache")
    config = ds.to_config()
    text = json.dumps(config)
    for secret in ("AKIAEXAMPLE", "s3cr3t", "t0ken", "b3arer", "hunter2"):
        assert secret not in text
    source = config["source"]
    assert source["storage_options"] == {
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "headers": {"User-Agent": "tidal"},
    }
    assert source["storage_options_removed"] == [
        "key", "secret", "token", "client_kwargs.aws_secret_access_key", "headers.Authorization", "password"
    ]  # fmt: skip
    assert source["cache_dir"] == str(tmp_path / "cache")
    again = tidal.Dataset.from_config(config)
    assert again.fingerprint() == ds.fingerprint() and len(list(again)) == 10
    signed = "https://user:pa55@host.example/data/a.jsonl?X-Amz-Signature=abc"  # credentials in a URL itself
    assert public_source([signed, "data/web"]) == (["https://host.example/data/a.jsonl", "data/web"], True)


def test_the_loader_takes_its_settings_from_the_config(data: Path, tmp_path: Path) -> None:
    config = rich(data)
    config["loader"] = {"num_workers": 0, "prefetch_to_device": 1}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    loader = tidal.DataLoader.from_config(tmp_path / "pipeline.yaml")
    assert loader.num_workers == 0 and loader._prefetch == 1
    reference = tidal.DataLoader(tidal.Dataset.from_config(config))
    for a, b in zip(itertools.islice(loader, 3), itertools.islice(reference, 3), strict=True):
        assert same(a, b)
    assert tidal.DataLoader.from_config(config, prefetch_to_device=0)._prefetch == 0  # arguments override


def test_inspect_shows_the_resolved_pipeline(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(mixed(data), sort_keys=False))
    assert main(["inspect", "--config", str(tmp_path / "pipeline.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mix({'web': Dataset(5 shards, 240 records).repeat(None)")
    assert "stream web: 5 shards, 240 records" in out and "stream code: 5 shards" in out
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(put(mixed(data), ["mix"], "sed")))
    assert main(["inspect", "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "config['mix']['sed']: unknown key" in capsys.readouterr().err


STEP = st.sampled_from(["map", "filter", "tokenize", "pack", "none"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.none() | st.integers(0, 9),
    block=st.sampled_from([7, 50, 16384]),
    epochs=st.sampled_from([None, 1, 2]),
    middle=st.lists(STEP, max_size=3),
    batch=st.none() | st.tuples(st.integers(1, 4), st.booleans(), st.booleans()),
    mixed_in=st.booleans(),
)
def test_random_chains_round_trip(data: Path, seed, block, epochs, middle, batch, mixed_in) -> None:
    ds = tidal.Dataset(data / "web", columns=["id", "text"])
    if seed is not None:
        ds = ds.shuffle(seed, block_size=block)
    if epochs != 1:
        ds = ds.repeat(epochs)
    if mixed_in:
        other = tidal.Dataset(data / "code", columns=["id", "text"]).repeat()
        ds = tidal.mix({"a": ds, "b": other}, weights={"a": 2.0, "b": 1.0}, seed=seed or 0, stop="all_exhausted")
    tokenized = False
    for step in middle:
        if step == "map" and not tokenized:
            ds = ds.map(add_length)
        elif step == "filter" and not tokenized:
            ds = ds.filter(is_even)
        elif step == "tokenize" and not tokenized:
            ds, tokenized = ds.tokenize(str(data / "tokenizer.json")), True
        elif step == "pack" and tokenized:
            ds = ds.pack(8)
    if batch is not None:
        size, drop_last, continuous = batch
        ds = ds.batch(size, continuous=True) if continuous else ds.batch(size, drop_last=drop_last)
    round_trip(ds, items=4)


def test_the_schema_names_every_argument_of_the_chain() -> None:
    import inspect

    from tidal import config

    def arguments(fn: Any) -> set[str]:
        return {p for p in inspect.signature(fn).parameters if p != "self"}

    for name, (required, optional) in config.STEPS.items():
        assert set(required + optional) == arguments(getattr(tidal.Dataset, name)), name
    assert set(config.source_keys(tidal.Dataset)) - {"storage_options_removed"} == arguments(tidal.Dataset.__init__)
    assert set(config.MIX) - {"streams"} == arguments(tidal.mix) - {"datasets"}
    loader = arguments(tidal.DataLoader.__init__) | arguments(__import__("torch").utils.data.DataLoader.__init__)
    assert set(config.LOADER) <= loader


def test_the_schema_lists_every_field_of_every_step() -> None:
    """The steps' keys are read from the stages' own fields: each field of each kind of step (but
    its upstream and what is marked internal) is a key of its method, and nothing else is."""
    from dataclasses import fields

    from tidal import config
    from tidal.stages import INTERNAL

    for kind in config.KINDS:
        declared = {f.name for f in fields(kind.fields_of()) if f.name != "upstream" and f.metadata != INTERNAL}
        required, optional = config.STEPS[kind.METHOD]
        assert declared | set(dict(kind.EXTRA)) <= set(required + optional), kind.__name__
    written = {name for kind in config.KINDS for name in kind.arguments()[0] + kind.arguments()[1]}
    assert written == {name for required, optional in config.STEPS.values() for name in required + optional}


def test_a_field_added_to_a_stage_is_a_key_of_its_step(data: Path) -> None:
    """A stage grows a field: its step takes and writes the key, with no line of tidal.config changed."""
    from dataclasses import dataclass, field

    from tidal import config
    from tidal.stages import INTERNAL
    from tidal.stages.batch import Batch

    @dataclass(frozen=True, repr=False)
    class Windowed(Batch):
        window: int = 1
        scratch: int = field(default=0, metadata=INTERNAL)

    schema = config.steps_schema([*config.KINDS, Windowed])
    assert schema["batch"] == (("size",), ("drop_last", "continuous", "window"))
    assert {m: s for m, s in schema.items() if m != "batch"} == {m: s for m, s in config.STEPS.items() if m != "batch"}

    @dataclass(frozen=True, repr=False)
    class Sized(Batch):
        METHOD = "sized"
        limit: int = 0

    assert config.steps_schema([Sized]) == {"sized": (("size",), ("drop_last", "limit"))}
    source = tidal.Dataset(data / "web").stage
    assert Windowed(source, 4, window=3).config_step() == {"batch": {"size": 4, "drop_last": True, "window": 3}}
    assert Sized(source, 2, limit=5).to_config()["steps"] == [{"sized": {"size": 2, "drop_last": True, "limit": 5}}]


def test_a_config_of_relative_paths_reads_the_same_data_from_any_directory(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """to_config() writes local paths absolute (the data the dataset read), so the config file
    builds the same dataset wherever it is used from; URLs stay as they are."""
    monkeypatch.chdir(data)
    web = tidal.Dataset("web", columns=["id", "text"]).shuffle(seed=1)
    mixed = tidal.mix(
        {
            "web": web.tokenize("tokenizer.json").pack(8),
            "code": tidal.Dataset(["code/part-000.jsonl"]).tokenize("tokenizer.json").pack(8),
        },
        weights={"web": 0.5, "code": 0.5},
    ).batch(2)
    config = mixed.to_config()
    streams = config["mix"]["streams"]
    assert streams["web"]["source"]["src"] == str(data / "web")
    assert streams["code"]["source"]["src"] == [str(data / "code" / "part-000.jsonl")]
    assert streams["web"]["steps"][1]["tokenize"]["tokenizer"] == str(data / "tokenizer.json")
    (tmp_path / "pipeline.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    again = tidal.Dataset.from_config(tmp_path / "pipeline.json")
    assert again.fingerprint() == mixed.fingerprint()
    for a, b in zip(itertools.islice(mixed, 4), itertools.islice(again, 4), strict=True):
        assert same(a, b)
    from tidal.config import absolute

    remote = absolute({"source": {"src": ["s3://bucket/web/", "hf://datasets/org/x"]}})
    assert remote["source"]["src"] == ["s3://bucket/web/", "hf://datasets/org/x"]
