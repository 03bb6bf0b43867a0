"""TRL's DPOTrainer on thicket's DPO datasets, loaded by config name, and how much of a trajectory
pair's scored part is the environment's words.

    bash bench/trl_venv.sh                                   # bench/.venv-trl: TRL 1.16, CPU torch
    bench/.venv-trl/bin/python bench/trl_dpo.py [--spec sweeps/frozenlake-dense.yaml] [--steps 6]

It runs the spec with `.venv/bin/thicket run` (uniform policy: no model needed) unless its datasets
are there, builds the tiny random demo model with this venv's torch, then:
  1. counts, over `dpo`'s trajectory pairs, the completion tokens TRL would score and how many of
     them are observations (user turns), as the chat template renders them;
  2. trains DPOTrainer on `dpo_first_turn` as it is (one assistant message a side: no observation);
  3. trains DPOTrainer on `dpo` with a collator that masks the messages flagged `loss: false`,
     and checks that the mask it scores holds exactly the assistant turns' tokens.
The model is random: the point is that the data go in as they are, not what the model learns.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from trl import DPOConfig, DPOTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference

ROOT = Path(__file__).resolve().parents[1]
THICKET = ROOT / ".venv" / "bin" / "thicket"


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], generation_prompt: bool = False,
           ) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                        return_dict=True)
    return list(out["input_ids"])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def trained_flags(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[bool]:
    """Per token of the rendered chat, whether it is one the policy sampled in a trained message:
    an assistant message's content and its end-of-turn token, unless the message is flagged
    `loss: false`. Its role header and what the template writes after end-of-turn are not."""
    full = render(tokenizer, messages)
    end_of_turn = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    flags = [False] * len(full)
    for k, message in enumerate(messages):
        if message["role"] != "assistant" or message.get("loss", True) is False:
            continue
        begin = len(render(tokenizer, messages[:k], generation_prompt=True))
        stop = len(render(tokenizer, messages[: k + 1])) if k + 1 < len(messages) else len(full)
        if end_of_turn in full[begin:stop]:
            stop = begin + full[begin:stop].index(end_of_turn) + 1
        flags[begin:stop] = [True] * (stop - begin)
    return flags


def completion_flags(tokenizer: PreTrainedTokenizerBase, prompt: list[dict], side: list[dict]) -> list[bool]:
    """trained_flags over the completion TRL cuts from prompt + side (see its tokenize_fn)."""
    full = render(tokenizer, prompt + side)
    start = common_prefix(render(tokenizer, prompt, generation_prompt=True), full)
    return trained_flags(tokenizer, prompt + side)[start:]


@dataclass
class ObservationMasking(DataCollatorForPreference):
    """TRL's preference collator, then the completion mask cut to the tokens of `loss: true` messages."""

    tokenizer: Any = None
    scored: int = 0  # completion tokens left in the mask, over every batch
    masked: int = 0  # completion tokens taken out (observations)

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        rows = len(examples)
        for i, example in enumerate(examples):
            for row, side in ((i, "chosen"), (rows + i, "rejected")):
                flags = completion_flags(self.tokenizer, example["prompt"], example[side])
                assert len(flags) == len(example[f"{side}_ids"]), "token spans do not line up with TRL's ids"
                start = len(example["prompt_ids"])
                width = max(0, min(len(flags), batch["completion_mask"].shape[1] - start))  # after max_length
                keep = torch.tensor(flags[:width], dtype=batch["completion_mask"].dtype)
                batch["completion_mask"][row, start : start + width] *= keep
                self.scored += int(keep.sum())
                self.masked += width - int(keep.sum())
        return batch


def sweep_datasets(spec: Path, work: Path) -> Path:
    name = next(line.split(":", 1)[1].strip() for line in spec.read_text().splitlines() if line.startswith("name:"))
    folder = work / name / "datasets"
    if not (folder / "_SUCCESS.json").exists():
        started = time.perf_counter()
        subprocess.run([str(THICKET), "run", str(spec), "--output", str(work), "--no-progress", "--policy", "uniform"],
                       check=True, cwd=ROOT, capture_output=True)
        print(f"thicket run {spec.name} (uniform policy): {time.perf_counter() - started:.1f} s")
    return folder


def tiny_model(work: Path) -> Path:
    model = work / "model"
    if not (model / "config.json").exists():
        subprocess.run([str(THICKET), "make-model", str(model), "--python", sys.executable], check=True, cwd=ROOT,
                       capture_output=True)
    return model


def observation_share(tokenizer: PreTrainedTokenizerBase, pairs: datasets.Dataset) -> None:
    trajectories = pairs.filter(lambda row: row["kind"] == "trajectory")
    tokens = observed = user_turns = 0
    for row in trajectories:
        for side in ("chosen", "rejected"):
            flags = completion_flags(tokenizer, row["prompt"], row[side])
            tokens += len(flags)
            observed += len(flags) - sum(flags)
            user_turns += sum(m["role"] == "user" for m in row[side])
    share = observed / tokens if tokens else float("nan")
    print(f"dpo: {len(pairs)} pairs, {len(trajectories)} trajectory pairs holding {user_turns} user turns; "
          f"{tokens} completion tokens TRL would score, {observed} of them observations ({share:.1%})")


def train(model: Path, tokenizer: PreTrainedTokenizerBase, rows: datasets.Dataset, steps: int, out: Path,
          collator: DataCollatorForPreference | None = None) -> list[float]:
    config = DPOConfig(output_dir=str(out), max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
                       report_to=[], save_strategy="no", use_cpu=True, remove_unused_columns=collator is None,
                       dataset_num_proc=None, bf16=False)
    trainer = DPOTrainer(model=str(model), args=config, train_dataset=rows, processing_class=tokenizer,
                         data_collator=collator)
    started = time.perf_counter()
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"  {len(losses)} steps in {time.perf_counter() - started:.1f} s, losses {[round(x, 4) for x in losses]}")
    assert losses and all(math.isfinite(x) for x in losses)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "sweeps" / "frozenlake-dense.yaml")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "thicket-trl")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    folder = sweep_datasets(args.spec.resolve(), args.work)
    model = tiny_model(args.work)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    cache = str(args.work / "hf-cache")
    pairs = datasets.load_dataset(str(folder), "dpo", split="train", cache_dir=cache)
    first = datasets.load_dataset(str(folder), "dpo_first_turn", split="train", cache_dir=cache)
    observation_share(tokenizer, pairs)
    print(f"dpo_first_turn: {len(first)} pairs, as they are (one assistant message a side)")
    train(model, tokenizer, first, args.steps, args.work / "out-first-turn")
    print("dpo with observations masked by their loss flags")
    masking = ObservationMasking(pad_token_id=tokenizer.pad_token_id or 0, tokenizer=tokenizer)
    train(model, tokenizer, pairs, args.steps, args.work / "out-masked", masking)
    print(f"  scored {masking.scored} assistant tokens, masked {masking.masked} observation tokens")
    assert masking.masked > 0, "no observation was masked: the sweep gave no multi-turn trajectory pairs"


if __name__ == "__main__":
    main()
