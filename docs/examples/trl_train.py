"""Train a policy on a thicket sweep with TRL: SFT on its `sft` rows, then DPO on its
`dpo_first_turn` pairs, each loaded with `thicket.load` (verified against the sweep's
_SUCCESS.json, no cache in between).

    python docs/examples/trl_train.py SWEEP BASE_MODEL OUT [--steps 100]

SWEEP: a sweep's folder or URI (out/NAME, s3://bucket/prefix/NAME); BASE_MODEL: a local model
folder or a hub id; OUT gets OUT/sft and OUT/dpo, each a model folder vLLM can serve (OUT/dpo
starts from OUT/sft). Needs `pip install 'thicket[train]' trl torch`. See docs/training.md.
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

import thicket


def common(out: str, steps: int) -> dict:
    """What both trainers share: CPU or GPU as found (bf16 on a GPU), no checkpoints mid-run, no trackers."""
    gpu = torch.cuda.is_available()
    return {"output_dir": out, "max_steps": steps, "per_device_train_batch_size": 4, "logging_steps": 1,
            "save_strategy": "no", "report_to": [], "seed": 0, "bf16": gpu, "use_cpu": not gpu}


def sft(sweep: str, base: str, out: str, steps: int) -> dict:
    rows = thicket.load(sweep, "sft").select_columns(["messages"])  # TRL's conversational format
    model = AutoModelForCausalLM.from_pretrained(base, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(base)
    trainer = SFTTrainer(model=model, args=SFTConfig(**common(out, steps), learning_rate=5e-4),
                         train_dataset=rows, processing_class=tokenizer)
    result = trainer.train()
    trainer.save_model(out)
    tokenizer.save_pretrained(out)
    return {"stage": "sft", "rows": len(rows), "loss": result.training_loss}


def dpo(sweep: str, base: str, out: str, steps: int) -> dict:
    # One assistant message a side: TRL scores exactly the two steps where the paths part.
    pairs = thicket.load(sweep, "dpo_first_turn").select_columns(["prompt", "chosen", "rejected"])
    model = AutoModelForCausalLM.from_pretrained(base, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(base)
    trainer = DPOTrainer(model=model, args=DPOConfig(**common(out, steps), learning_rate=2e-4, beta=0.1),
                         train_dataset=pairs, processing_class=tokenizer)
    result = trainer.train()
    trainer.save_model(out)
    tokenizer.save_pretrained(out)
    return {"stage": "dpo", "rows": len(pairs), "loss": result.training_loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep")
    parser.add_argument("base_model")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(sft(args.sweep, args.base_model, f"{args.out}/sft", args.steps)))
    print(json.dumps(dpo(args.sweep, f"{args.out}/sft", f"{args.out}/dpo", args.steps)))


if __name__ == "__main__":
    main()
