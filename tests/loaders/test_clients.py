"""The real clients that drive tidal, each as its users drive it, resume exactly.

torchdata's ``StatefulDataLoader`` over a tidal Dataset; HF Accelerate's ``prepare``,
``save_state`` and ``load_state`` (in one process here, over two under torchrun below);
Lightning's ``Trainer.fit(..., ckpt_path=...)`` from a checkpoint taken mid-epoch, with a
loader and with a ``LightningDataModule``. (The HF Trainer is in ``test_hf.py``.)
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import make_shards

import tidal

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:torchdata.*"),
    pytest.mark.filterwarnings("ignore::UserWarning:lightning.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # from inside lightning and torch
]

CLIENTS = Path(__file__).parents[1] / "clients"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_shards(tmp_path_factory.mktemp("clients") / "data", [40, 75, 13, 60, 52, 33, 90, 17])


def dataset(data: Path, repeat: int | None = 2) -> tidal.Dataset:
    return tidal.Dataset(data).shuffle(seed=1, block_size=32).repeat(repeat).batch(6)


def ids(batches: list[dict]) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_batch_for_batch(data: Path, workers: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = dataset(data)
    full = ids(list(StatefulDataLoader(ds, batch_size=None, num_workers=workers)))
    assert full == ids(list(tidal.DataLoader(ds, num_workers=workers)))
    for stop in (1, 17, len(full) - 1):
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
        head = ids(list(itertools.islice(loader, stop)))
        state = loader.state_dict()
        resumed = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
        resumed.load_state_dict(state)
        assert head + ids(list(resumed)) == full, f"resumed after {stop} batches"


@pytest.fixture
def accelerate_state() -> Iterator[None]:
    from accelerate.state import AcceleratorState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_accelerate_prepare_save_and_load_state_in_one_process(
    data: Path, tmp_path: Path, accelerate_state: None
) -> None:
    from accelerate import Accelerator

    ds = dataset(data)
    full = ids(list(tidal.DataLoader(ds, num_workers=2)))
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, tidal.DataLoader(ds, num_workers=2))
    head = []
    for batch in loader:
        assert type(batch) is dict and isinstance(batch["id"], torch.Tensor)
        head.append(batch["id"].tolist())
        if len(head) == 17:
            accelerator.save_state(tmp_path / "checkpoint")
            break
    again = Accelerator(cpu=True)
    _, loader2 = again.prepare(torch.nn.Linear(1, 1), tidal.DataLoader(ds, num_workers=2))
    again.load_state(tmp_path / "checkpoint")
    assert head + ids(list(loader2)) == full


@pytest.mark.slow
def test_accelerate_over_two_processes_reads_each_record_once_and_resumes(data: Path, tmp_path: Path) -> None:
    from procs import child_env, torchrun

    out = tmp_path / "out"
    out.mkdir()
    env = child_env(tmp_path / "cache")
    torchrun(CLIENTS / "run_accelerate.py", str(data), str(out), "run", nproc=2, env=env)
    torchrun(CLIENTS / "run_accelerate.py", str(data), str(out), "resume", nproc=2, env=env)
    runs = [json.loads((out / f"run-{r}.json").read_text()) for r in range(2)]
    resumed = [json.loads((out / f"resume-{r}.json").read_text()) for r in range(2)]
    seen = [i for r in runs for b in r for i in b]
    assert len(seen) == len(set(seen)), "a record was read by both processes"
    n = sum([40, 75, 13, 60, 52, 33, 90, 17])
    readers = 2 * 2  # processes x workers
    assert len(seen) == 6 * ((n // readers) // 6) * readers, "records were dropped beyond the documented remainder"
    for rank in range(2):
        assert resumed[rank] == runs[rank][7:], f"rank {rank} did not continue after its 7th batch"


# -- Lightning --------------------------------------------------------------------------------------------


def lightning_run(data: Path, root: Path, resume: Path | None = None, datamodule: bool = False) -> list:
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[list[int]] = []

        def training_step(self, batch: dict, index: int) -> torch.Tensor:
            self.seen.append(batch["id"].tolist())
            return self.layer(batch["id"].float()[:, None]).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> tidal.DataLoader:
            return tidal.DataLoader(dataset(data, repeat=1), num_workers=2)

    model = Model()
    every = L.pytorch.callbacks.ModelCheckpoint(dirpath=root, every_n_train_steps=10, save_top_k=-1)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[every],
    )
    if datamodule:
        trainer.fit(model, datamodule=Data(), ckpt_path=resume)
    else:
        trainer.fit(model, tidal.DataLoader(dataset(data, repeat=1), num_workers=2), ckpt_path=resume)
    return model.seen


@pytest.mark.parametrize("datamodule", [False, True], ids=["loader", "datamodule"])
def test_lightning_resumes_mid_epoch_on_the_batches_an_uninterrupted_run_sees(
    data: Path, tmp_path: Path, datamodule: bool
) -> None:
    full = lightning_run(data, tmp_path / "a", datamodule=datamodule)
    assert len(full) == len(ids(list(tidal.DataLoader(dataset(data, repeat=1), num_workers=2)))) > 20
    for step in (10, 20):
        checkpoint = next((tmp_path / "a").glob(f"*step={step}.ckpt"))
        rest = lightning_run(data, tmp_path / f"b{step}", resume=checkpoint, datamodule=datamodule)
        assert rest == full[step:], f"resumed from the checkpoint at step {step}"
