"""tidal.integrations: loader.metrics() in the Hugging Face Trainer's logs, in Lightning's loggers and on a
Prometheus endpoint, each with the real library running a few training steps on CPU."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from makers import EOS, word_tokenizer, write_docs

import tidal

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:lightning.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, EOS, rng.integers(5, 50)).tolist() for _ in range(120)]
    return write_docs(tmp_path_factory.mktemp("integrations") / "docs", docs, shards=4)


def packed(docs: Path, shift_labels: bool = True) -> tidal.Dataset:
    return (
        tidal.Dataset(docs)
        .shuffle(seed=3, block_size=20)
        .repeat()
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(32, shift_labels=shift_labels)
    )


def test_importing_the_integrations_imports_none_of_their_libraries() -> None:
    code = (
        "import sys, tidal, tidal.integrations\n"
        "heavy = [m for m in ('transformers', 'lightning', 'pytorch_lightning', 'prometheus_client') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert tidal.integrations.prometheus.serve\n"  # the module loads when asked for
        "assert 'prometheus_client' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- Hugging Face Trainer ------------------------------------------------------------------------------------


def test_the_trainer_logs_the_loaders_metrics_at_every_logging_step(docs: Path, tmp_path: Path) -> None:
    import transformers

    from tidal.hf import TidalTrainer
    from tidal.integrations import hf

    class Reporter(transformers.TrainerCallback):  # a reporting integration (W&B, TensorBoard): it runs first
        def __init__(self) -> None:
            self.logged: list[dict] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs is not None and "loss" in logs:
                self.logged.append({"step": state.global_step, **logs})

    seen: list[int] = []  # non-padding tokens of every batch the model trained on

    class Counting(TidalTrainer):
        def training_step(self, model: Any, inputs: dict, *args: Any, **kwargs: Any) -> Any:
            seen.append(int(inputs["input_ids"].numel()))  # concat packing: no padding
            return super().training_step(model, inputs, *args, **kwargs)

    config = transformers.GPT2Config(vocab_size=EOS + 1, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=2, logging_steps=2,
        report_to=[], use_cpu=True, dataloader_num_workers=2, disable_tqdm=True, save_strategy="no", seed=0,
    )  # fmt: skip
    reporter = Reporter()
    trainer = Counting(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=packed(docs, shift_labels=False),
        callbacks=[reporter],
    )
    hf.attach(trainer)
    trainer.train()
    assert [e["step"] for e in reporter.logged] == [2, 4, 6]
    for entry in reporter.logged:
        step = entry["step"]
        assert entry["data/batches"] == step  # what the Trainer had taken when it logged
        assert entry["data/records"] == 2 * step
        assert entry["data/tokens"] == sum(seen[:step]) == 2 * 32 * step
        assert 0 <= entry["data/data_wait_share"] <= 1 and entry["data/data_wait_s"] >= 0
    history = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["data/batches"] for e in history] == [2, 4, 6]  # and in trainer_state.json


def test_the_callback_finds_the_trainers_tidal_loader_when_given_none(docs: Path, tmp_path: Path) -> None:
    import transformers

    from tidal.hf import TidalTrainer
    from tidal.integrations.hf import MetricsCallback

    config = transformers.GPT2Config(vocab_size=EOS + 1, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2, logging_steps=1,
        report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0,
    )  # fmt: skip
    trainer = TidalTrainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=packed(docs, shift_labels=False),
        callbacks=[MetricsCallback(prefix="tidal/")],
    )
    trainer.train()
    history = [e for e in trainer.state.log_history if "loss" in e]
    assert [(e["tidal/batches"], e["tidal/records"]) for e in history] == [(1, 2), (2, 4), (3, 6)]


# -- Lightning -----------------------------------------------------------------------------------------------


def fit_with_lightning(loader: tidal.DataLoader, callback: Any, steps: int) -> tuple[list[tuple[int, dict]], list[int]]:
    """Fit a tiny model on ``loader`` for ``steps`` steps, logging every 2: the rows its logger got
    (step, metrics), and the tokens of every batch it trained on."""
    import lightning as L
    from lightning.pytorch.loggers import Logger

    class Recorder(Logger):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int, dict]] = []

        @property
        def name(self) -> str:
            return "recorder"

        @property
        def version(self) -> int:
            return 0

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

        def log_metrics(self, metrics: dict, step: int | None = None) -> None:
            self.rows.append((int(step or 0), dict(metrics)))

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(EOS + 1, 1)
            self.tokens: list[int] = []

        def training_step(self, batch: dict, index: int) -> torch.Tensor:
            self.tokens.append(int(batch["input_ids"].numel()))
            loss = self.embed(batch["input_ids"]).mean()
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    recorder = Recorder()
    model = Model()
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", logger=recorder, log_every_n_steps=2, callbacks=[callback],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(model, loader)
    return recorder.rows, model.tokens


def test_lightning_logs_the_loaders_metrics_to_its_loggers(docs: Path, tmp_path: Path) -> None:
    from tidal.integrations.lightning import MetricsCallback

    loader = tidal.DataLoader(packed(docs).batch(4), num_workers=2)
    rows, tokens = fit_with_lightning(loader, MetricsCallback(), steps=8)
    logged = [(step, row) for step, row in rows if "data/batches" in row]
    assert len(logged) >= 3
    for step, row in logged:
        trained = step + 1  # Lightning's step of the row: batches trained on, less one
        assert row["data/batches"] in (trained, trained + 1)  # it fetches one batch ahead of training
        assert row["data/records"] == 4 * row["data/batches"]
        assert row["data/tokens"] == 4 * 32 * row["data/batches"]
        assert 0 <= row["data/data_wait_share"] <= 1 and "loss" in row
    assert loader.metrics()["tokens"] >= sum(tokens) == 8 * 4 * 32


class Large:
    """A loader as the integrations see one, whose counts need more than float32's 24 bits."""

    def metrics(self) -> dict[str, float | int]:
        return {"tokens": 123_456_789, "records": 2**40 + 1, "tokens/web": 2**52 + 3, "weight/web": 0.3}


def test_counts_are_logged_exactly_by_every_integration(docs: Path) -> None:
    import transformers
    from prometheus_client import CollectorRegistry, generate_latest

    from tidal.integrations import hf, lightning, prometheus

    rows, _ = fit_with_lightning(tidal.DataLoader(packed(docs).batch(4)), lightning.MetricsCallback(Large()), steps=2)
    ((_, row),) = [(step, row) for step, row in rows if "data/tokens" in row]
    assert (row["data/tokens"], row["data/records"], row["data/tokens/web"]) == (123_456_789, 2**40 + 1, 2**52 + 3)
    logs: dict = {"loss": 1.0}
    state = transformers.TrainerState(global_step=3)
    hf.MetricsCallback(Large()).on_log(None, state, None, logs=logs)
    assert logs["data/tokens"] == 123_456_789 and type(logs["data/tokens"]) is int
    registry = CollectorRegistry()
    registry.register(prometheus.collector(Large(), rank=0))
    scraped = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            scraped[name] = value
    assert float(scraped['tidal_tokens_total{rank="0"}']) == 123_456_789
    assert float(scraped['tidal_stream_tokens_total{rank="0",stream="web"}']) == 2**52 + 3


# -- Prometheus ----------------------------------------------------------------------------------------------


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_a_prometheus_endpoint_serves_the_metrics_as_they_grow(docs: Path, tmp_path: Path) -> None:
    from tidal.integrations import prometheus

    rng = np.random.default_rng(1)
    code = write_docs(tmp_path / "code", [rng.integers(0, EOS, 9).tolist() for _ in range(30)], 2)
    tok = word_tokenizer()
    web = tidal.Dataset(docs).repeat().tokenize(tok, eos="<eos>")
    mixed = tidal.mix({"web": web, "code": tidal.Dataset(code).repeat().tokenize(tok, eos="<eos>")}, [0.75, 0.25])
    loader = tidal.DataLoader(mixed.batch(4), num_workers=2)
    with prometheus.serve(loader, port=0) as server:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", server.url) and server.port > 0
        before = scrape(server.url)
        assert before['tidal_batches_total{rank="0"}'] == 0
        batches = iter(loader)
        for _ in range(5):
            next(batches)
        m = loader.metrics()
        after = scrape(server.url)
    assert after['tidal_batches_total{rank="0"}'] == 5
    assert after['tidal_records_total{rank="0"}'] == 20 == m["records"]
    assert after['tidal_tokens_total{rank="0"}'] == m["tokens"] > 0
    assert 0 < after['tidal_data_wait_share{rank="0"}'] <= 1
    streams = {s: after[f'tidal_stream_tokens_total{{rank="0",stream="{s}"}}'] for s in ("web", "code")}
    assert sum(streams.values()) == m["tokens"] and streams == {"web": m["tokens/web"], "code": m["tokens/code"]}
    assert after['tidal_stream_weight{rank="0",stream="web"}'] == 0.75
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)  # closed: the port is free again


def test_a_collector_goes_on_a_registry_of_ones_own(docs: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from tidal.integrations.prometheus import collector

    loader = tidal.DataLoader(tidal.Dataset(docs).batch(10))
    registry = CollectorRegistry()
    registry.register(collector(loader, prefix="data_", rank=3))
    list(loader)
    text = generate_latest(registry).decode()
    assert 'data_records_total{rank="3"} 120.0' in text
    assert "# TYPE data_data_wait_share gauge" in text and "# TYPE data_records_total counter" in text
