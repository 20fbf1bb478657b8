"""Train a causal LM with the Hugging Face Trainer on a tidal stream (tokenized and packed on the fly).

    python examples/train_causal_lm.py --data DIR --tokenizer tokenizer.json --max_steps 1000 --out run/
    python examples/train_causal_lm.py ... --resume       # model, optimizer, scheduler and data continue

The Trainer counts steps (``max_steps``); the stream repeats forever, reshuffled every epoch.
``--model`` takes a transformers config name or directory (e.g. a local Llama config); by
default a small GPT-2 is built from scratch. Works under torchrun too.
"""

from __future__ import annotations

import argparse

import transformers

import tidal
from tidal.hf import TidalTrainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="file, directory, glob or URL of the text shards")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, or a directory with one")
    p.add_argument("--model", default=None, help="a transformers config (name or directory); default: tiny GPT-2")
    p.add_argument("--text_column", default="text")
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--strategy", default="concat", choices=["concat", "best_fit"])
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_steps", type=int, default=1000)
    p.add_argument("--save_steps", type=int, default=100)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="run")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    args = p.parse_args()

    ds = (
        tidal.Dataset(args.data, columns=[args.text_column])
        .shuffle(seed=args.seed)
        .repeat()
        .tokenize(args.tokenizer, column=args.text_column)
        .pack(args.seq_len, args.strategy, shift_labels=False)  # HF models shift labels themselves
    )
    tok = tidal.stages.tokenize.load(args.tokenizer)
    vocab, eos = tok.backend.get_vocab_size(), tok.eos_id
    if args.model:
        config = transformers.AutoConfig.from_pretrained(args.model, vocab_size=vocab, eos_token_id=eos)
    else:
        config = transformers.GPT2Config(
            vocab_size=vocab,
            n_positions=args.seq_len,
            n_embd=128,
            n_layer=2,
            n_head=4,
            bos_token_id=eos,
            eos_token_id=eos,
        )
    model = transformers.AutoModelForCausalLM.from_config(config)
    training = transformers.TrainingArguments(
        output_dir=args.out,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        save_steps=args.save_steps,
        logging_steps=10,
        dataloader_num_workers=args.num_workers,
        report_to=[],
        seed=args.seed,
    )
    trainer = TidalTrainer(model=model, args=training, train_dataset=ds)
    trainer.train(resume_from_checkpoint=True if args.resume else None)


if __name__ == "__main__":
    main()
