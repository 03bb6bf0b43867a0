"""The random test models: their sizes, end_logit making them end lines and turns, and the torch
that building one needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from thicket.errors import BadInput
from thicket.tiny_model import SIZES, build_tiny_model, vllm_python

# Per model folder: the next token's probabilities of the eos and of "\n" (byte-level "Ċ")
# after a prompt and a started thought.
PROBE = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
for folder in sys.argv[1:]:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "Goal: craft a bed."}], add_generation_prompt=True,
                                  return_dict=False)
    ids += tok("Thought: I need", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
    print(float(probs[tok.eos_token_id]), float(probs[tok.convert_tokens_to_ids("\\u010a")]))
"""


def test_end_logit_makes_the_model_end_lines_and_turns(tmp_path: Path) -> None:
    plain = build_tiny_model(tmp_path / "plain")
    ending = build_tiny_model(tmp_path / "ending", end_logit=3.6)
    small = build_tiny_model(tmp_path / "small", end_logit=3.6, size="small")
    out = subprocess.run([vllm_python(), "-c", PROBE, str(plain), str(ending), str(small)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (plain_eos, plain_newline), *ends = (map(float, line.split()) for line in out.stdout.splitlines())
    assert plain_eos < 0.01 and plain_newline < 0.01  # ~1/600: a random model's flat distribution
    for eos, newline in ends:
        assert 0.02 < eos < 0.15 and 0.02 < newline < 0.15  # ~5% each at 3.6
    for folder, size in ((ending, SIZES["tiny"]), (small, SIZES["small"])):
        config = json.loads((folder / "config.json").read_text())
        assert (config["hidden_size"], config["num_hidden_layers"]) == (size.hidden, size.layers)


def test_an_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="model size: 'huge' is not one of tiny, small"):
        build_tiny_model(tmp_path / "m", size="huge")


def test_build_tiny_model_needs_torch(tmp_path: Any) -> None:
    with pytest.raises(BadInput, match="lacks torch"):
        build_tiny_model(tmp_path / "m", python=sys.executable)
