"""One round of training with TRL from a base policy, as bench/data_value.py's arms train:
SFT or DPO on rows thicket's datasets hold, with hyper-parameters fixed for every arm.

    bench/.venv-trl/bin/python bench/trl_train.py {sft|dpo} BASE_MODEL ROWS.jsonl OUT_DIR SETTINGS_JSON

ROWS for sft: {"messages": [{"role", "content", "loss"?}]}: loss on the assistant messages not
flagged `loss: false` (Agent-R's revision rows flag the bad branch's turns), as the tokens the
chat template renders for them (bench/trl_dpo.py's spans). ROWS for dpo: {"prompt", "chosen",
"rejected"}, each side's observations masked by their `loss` flags (trl_dpo.ObservationMasking).
OUT_DIR gets the trained weights and the base's tokenizer, a folder vLLM serves. The last line
printed is a JSON summary: rows, steps, first and last loss, seconds.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from trl_dpo import ObservationMasking, render, trained_flags


# The demo policy's weights are saved as float16; trained on a CPU in float16 they lose precision
# (its own chats score a loss of 4 instead of 0.2) and every step is several times slower.
FLOAT32 = {"dtype": "float32"}


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    steps: int = 100
    batch: int = 8
    sft_learning_rate: float = 5e-4
    dpo_learning_rate: float = 2e-4
    beta: float = 0.1  # DPO's
    max_length: int = 2048  # the demo policy's positions
    threads: int = 2


def sft_example(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], max_length: int) -> dict[str, list[int]]:
    """input_ids of the rendered chat, and a mask of the tokens its trained assistant messages sampled."""
    flags = trained_flags(tokenizer, messages)
    return {"input_ids": render(tokenizer, messages)[:max_length], "assistant_masks": [int(f) for f in flags][:max_length]}


def train_sft(base: str, tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]], out: Path,
              settings: Settings) -> list[float]:
    examples = [sft_example(tokenizer, row["messages"], settings.max_length) for row in rows]
    data = datasets.Dataset.from_list([e for e in examples if any(e["assistant_masks"])])
    config = SFTConfig(output_dir=str(out / "trainer"), max_steps=settings.steps,
                       per_device_train_batch_size=settings.batch, learning_rate=settings.sft_learning_rate,
                       seed=settings.seed, logging_steps=min(10, settings.steps), report_to=[], save_strategy="no",
                       use_cpu=True, bf16=False, max_length=settings.max_length, dataset_num_proc=None,
                       model_init_kwargs=FLOAT32)
    trainer = SFTTrainer(model=base, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(out))
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def train_dpo(base: str, tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]], out: Path,
              settings: Settings) -> list[float]:
    data = datasets.Dataset.from_list([{key: row[key] for key in ("prompt", "chosen", "rejected")} for row in rows])
    config = DPOConfig(output_dir=str(out / "trainer"), max_steps=settings.steps,
                       per_device_train_batch_size=settings.batch, learning_rate=settings.dpo_learning_rate,
                       beta=settings.beta, seed=settings.seed, logging_steps=min(10, settings.steps), report_to=[],
                       save_strategy="no", use_cpu=True, bf16=False, max_length=settings.max_length,
                       remove_unused_columns=False, dataset_num_proc=None, model_init_kwargs=FLOAT32)
    masking = ObservationMasking(pad_token_id=tokenizer.pad_token_id or 0, tokenizer=tokenizer)
    trainer = DPOTrainer(model=base, args=config, train_dataset=data, processing_class=tokenizer,
                         data_collator=masking)
    trainer.train()
    trainer.save_model(str(out))
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


TRAINERS = {"sft": train_sft, "dpo": train_dpo}


def main(method: str, base: str, rows_path: Path, out: Path, settings: Settings) -> dict[str, Any]:
    torch.set_num_threads(settings.threads)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{rows_path}: no rows to train on")
    tokenizer = AutoTokenizer.from_pretrained(base)
    started = time.perf_counter()
    losses = TRAINERS[method](base, tokenizer, rows, out, settings)
    tokenizer.save_pretrained(str(out))
    for name in ("generation_config.json",):  # what vLLM reads beside the weights, when the base has it
        if (Path(base) / name).is_file() and not (out / name).is_file():
            (out / name).write_text((Path(base) / name).read_text())
    if not losses or not all(math.isfinite(x) for x in losses):
        raise SystemExit(f"{method}: losses {losses}")
    return {"method": method, "rows": len(rows), "steps": settings.steps, "first_loss": losses[0],
            "last_loss": losses[-1], "seconds": round(time.perf_counter() - started, 1), "settings": asdict(settings)}


if __name__ == "__main__":
    method, base, rows_file, out_dir, settings_json = sys.argv[1:6]
    if method not in TRAINERS:
        raise SystemExit(f"method: expected one of {', '.join(TRAINERS)}, got {method!r}")
    summary = main(method, base, Path(rows_file), Path(out_dir), Settings(**json.loads(settings_json)))
    print(json.dumps(summary))
