"""Train a small next-token model in plain JAX on a tidal stream; save and resume exactly.

    python examples/train_jax.py --data DIR --tokenizer tokenizer.json --max_steps 200 --out run/
    python examples/train_jax.py ... --resume     # continues params, optimizer and data, bit for bit

The stream is tokenized and packed on the fly; ``tidal.jax.Loader`` yields global arrays
sharded over every device (the batch axis), read and put on the devices in the background.
A checkpoint holds the parameters and optimizer state (``train.npz``), the step, and the
loader's state (``data.json``, small JSON): resuming from it trains on exactly the batches an
uninterrupted run would have seen, so the parameters come out bit-identical.

Several JAX processes (one per host): pass ``--distributed`` (``jax.distributed.initialize()``
finds the cluster); each process then reads its own share, ``loader.state_dict()`` gathers
all of them (call it on every process), and process 0 writes the checkpoint.
Uses optax (AdamW) when it is installed, else plain SGD.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import tidal
import tidal.jax
from tidal.stages.tokenize import load

try:
    import optax
except ImportError:  # plain SGD below
    optax = None


def init(key: jax.Array, vocab: int, dim: int) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(k1, (vocab, dim)) * 0.02,
        "mix": jax.random.normal(k2, (dim, dim)) / jnp.sqrt(dim),
        "out": jax.random.normal(k3, (dim, vocab)) / jnp.sqrt(dim),
    }


def loss_fn(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    x = params["embed"][batch["input_ids"]]  # (batch, seq, dim)
    seen = jnp.cumsum(x, axis=1) / jnp.arange(1, x.shape[1] + 1)[None, :, None]  # causal mean of the context
    logits = jnp.tanh((x + seen) @ params["mix"]) @ params["out"]
    labels = batch["labels"]
    mask = labels >= 0  # -100: no target (the end of a sequence)
    logp = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logp, jnp.where(mask, labels, 0)[..., None], axis=-1)[..., 0]
    return -(picked * mask).sum() / jnp.maximum(mask.sum(), 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", default="run")
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=8, help="per process")
    p.add_argument("--max_steps", type=int, default=200)
    p.add_argument("--save_every", type=int, default=50)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize() first")
    args = p.parse_args()
    if args.distributed:
        jax.distributed.initialize()

    ds = tidal.Dataset(args.data, columns=["text"]).shuffle(seed=0).repeat()
    ds = ds.tokenize(args.tokenizer).pack(args.seq_len).batch(args.batch_size)
    loader = tidal.jax.Loader(ds, num_workers=args.num_workers, prefetch=2)
    replicated = NamedSharding(tidal.jax.data_sharding().mesh, PartitionSpec())

    vocab = load(args.tokenizer).backend.get_vocab_size()
    params = init(jax.random.key(0), vocab, 64)
    optimizer = optax.adamw(args.lr) if optax is not None else None
    opt_state: Any = optimizer.init(params) if optimizer is not None else ()
    state, treedef = jax.tree_util.tree_flatten((params, opt_state))

    out, step = Path(args.out), 0
    if args.resume and (out / "latest").exists():
        ckpt = out / (out / "latest").read_text().strip()
        saved = np.load(ckpt / "train.npz")
        state = [jnp.asarray(saved[f"a{i}"], dtype=leaf.dtype) for i, leaf in enumerate(state)]
        loader.load_state_dict(json.loads((ckpt / "data.json").read_text()))
        step = json.loads((ckpt / "step.json").read_text())["step"]
        print(f"resumed at step {step} from {ckpt}")
    params, opt_state = jax.device_put(jax.tree_util.tree_unflatten(treedef, state), replicated)

    @jax.jit
    def train_step(params: Any, opt_state: Any, batch: dict[str, jax.Array]) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        if optimizer is None:
            return jax.tree_util.tree_map(lambda w, g: w - args.lr * g, params, grads), opt_state, loss
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for batch in loader:
        arrays = {k: batch[k] for k in ("input_ids", "labels")}
        params, opt_state, loss = train_step(params, opt_state, arrays)
        step += 1
        if step % 10 == 0 and jax.process_index() == 0:
            print(f"step {step} loss {float(loss):.3f}")
        if step % args.save_every == 0 or step == args.max_steps:
            data_state = loader.state_dict()  # on every process: it gathers them all
            if jax.process_index() == 0:
                ckpt = out / f"step-{step}"
                ckpt.mkdir(parents=True, exist_ok=True)
                leaves = jax.tree_util.tree_leaves((params, opt_state))
                np.savez(ckpt / "train.npz", **{f"a{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)})
                (ckpt / "data.json").write_text(json.dumps(data_state))
                (ckpt / "step.json").write_text(json.dumps({"step": step}))
                (out / "latest").write_text(ckpt.name)
        if step >= args.max_steps:
            break
    loader.close()


if __name__ == "__main__":
    main()
