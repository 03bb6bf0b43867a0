"""A tiny RANDOM (untrained) Llama-shaped chat model, built offline for tests and demos.

Its weights are random: it emits noise, not sensible agent turns. It exists so the real
vLLM server can be exercised end to end (sampling, seeds, logprobs, structured outputs,
prefix caching) on machines that cannot download a model.

Two sizes (SIZES): "tiny" (tests, demos) computes next to nothing per token, so a server's
per-token Python (logprobs, grammar, seeds) is nearly all it spends; "small" (~15M
parameters) does enough arithmetic per token on a CPU that serving costs what a model's
layers cost, for benchmarks that ask how busy a client keeps the server.

    python jobs/tiny_model.py OUT_DIR [END_LOGIT [SIZE [TOKENIZER]]]   # with an interpreter that has torch + transformers
    python jobs/tiny_model.py --tokenizer-only OUT_DIR [TOKENIZER]      # the tokenizer alone (tokenizers + transformers)

Two tokenizers (TOKENIZERS): "tiny" (the default, 600 tokens trained on a few KB of
TextCraft-like text: every test and the demo use it) and "stdlib" (32,768 tokens trained on the
Python standard library's own sources, which every interpreter ships: a realistic vocabulary,
so that prompt lengths and the server's per-token work resemble a real model's). The stdlib one
is trained in a few seconds on the interpreter that builds it; another Python version's stdlib
gives another (equally sized) vocabulary.

From the main venv (no torch there), `build_tiny_model(out_dir)` runs this file in a
subprocess. Nothing at import time needs torch, transformers, tokenizers or even thicket.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

SEED = 0
VOCAB = 600
STDLIB_VOCAB = 32768  # the GPU bench's random Qwen2 (../shared/gpu/make_model.py) has 32,768 embedding rows
TOKENIZERS = ("tiny", "stdlib")


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int  # head_dim = hidden / heads = 32: the smallest head size vLLM's CPU attention accepts
    kv_heads: int


SIZES = {
    "tiny": Size(hidden=64, layers=2, heads=2, kv_heads=1),  # ~0.16M parameters
    "small": Size(hidden=512, layers=4, heads=16, kv_heads=4),  # ~15M parameters
}
MAX_POSITIONS = 4096

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

README = """# {name}-random-llama (thicket test model)

RANDOM, UNTRAINED weights (torch.manual_seed({seed})). It produces noise, not language.
Llama architecture: hidden {hidden}, {layers} layers, {heads} heads, vocab {vocab}.
Tokenizer: byte-level BPE trained offline on a few KB of ReAct / TextCraft-like text.
Chat template: ChatML (<|im_start|>role\\ncontent<|im_end|>\\n); eos = <|im_end|>.
End logit: {end_logit} (the logits of the eos and of a newline raised by that much at every step).
Built by thicket/jobs/tiny_model.py for tests; do not use it for anything else.
"""

_ITEMS = (
    "oak planks", "birch planks", "stick", "wool", "white wool", "red dye", "blue dye",
    "crafting table", "wooden pickaxe", "stone pickaxe", "iron ingot", "oak log", "cobblestone",
    "bed", "torch", "coal", "string", "bow", "arrow", "ladder", "chest", "furnace", "white bed",
)
_DIRECTIONS = ("north", "south", "east", "west", "up", "down", "left", "right", "forward")


def _corpus() -> list[str]:
    """A few KB of text shaped like our prompts, so common words become single tokens."""
    lines = [
        "You are an agent in a text game. Answer every turn in exactly this format:",
        "Thought: <one short sentence of reasoning>",
        "Action: <one action>",
        "Crafting commands:",
        "Goal: craft white bed.",
        "Observation: Got 1 oak log. Valid actions: get | craft | inventory | look",
        "Inventory: [oak planks] (4) [stick] (2)",
        "Could not find enough items to craft minecraft:white_bed",
    ]
    for i, item in enumerate(_ITEMS):
        other = _ITEMS[(i + 3) % len(_ITEMS)]
        lines += [
            f"Thought: I need {item} first, so I should get it.",
            f"Action: get 1 {item}",
            f"Observation: Got 1 {item}",
            f"Thought: I have {other}, now I can craft {item}.",
            f"Action: craft 4 {item} using 1 {other}",
            f"Observation: Crafted 4 minecraft:{item.replace(' ', '_')}",
            "Action: inventory",
            f"Observation: Inventory: [{item}] (4) [{other}] (1)",
            f"craft 1 {item} using 2 {other}, 1 stick",
        ]
    for d in _DIRECTIONS:
        lines += [f"Action: go {d}", f"Observation: You go {d}. You see a door to the {d}.",
                  f"Thought: The goal is to the {d}, I will move {d}."]
    text = "\n".join(lines)
    return [text, text.lower(), "0123456789 !?.,:;()[]{}<>|-_'\"/\\+=*#@&%$~`^"]


def _stdlib_corpus() -> list[str]:
    """The running interpreter's standard library sources (~12 MB for CPython 3.11, its test
    suites and site-packages left out), in a fixed order: code, docstrings and comments, so the
    vocabulary holds English words as well as code, as a real model's does."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    files = sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts))
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def _build_tokenizer(kind: str = "tiny"):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=STDLIB_VOCAB if kind == "stdlib" else VOCAB,
        special_tokens=[PAD, IM_START, IM_END],  # ids 0, 1, 2 in both (and in ../shared/gpu/make_model.py's)
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # the stdlib one also sees the TextCraft-like text, so the game's words are in it as in the tiny one
    tok.train_from_iterator(_stdlib_corpus() + _corpus() if kind == "stdlib" else _corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def _favour(model, token_ids: list[int], logit: float, probe_ids: list[int]) -> None:  # model: LlamaForCausalLM
    """Raise the logits of `token_ids` by about `logit` at every step. Hidden dimension 0
    carries a constant (every embedding's 0th value) that no layer writes to, so the final
    norm leaves it at a near-constant value v (sqrt(hidden) while it dominates, less in a wider
    model whose layers write more into the other dimensions); the (tied) output weights of
    dimension 0 are that constant for every token (a shift softmax ignores) but these, which
    get logit / v more. v is measured on `probe_ids`."""
    import torch

    # far above the other dimensions of an embedding (~0.02), and of what a wider model's
    # layers write into them: while it dominates the norm, a favoured input token's larger
    # constant barely moves v (in the small model at 1.0, it made the next token ~50% an end)
    scale = model.config.hidden_size / SIZES["tiny"].hidden  # 1.0 in the tiny model
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
        embeddings = model.model.embed_tokens.weight
        embeddings[:, 0] = scale
        normed = model.model(torch.tensor([probe_ids])).last_hidden_state  # after the final norm
        embeddings[token_ids, 0] = scale + logit / float(normed[0, :, 0].mean())


def _build(out_dir: Path, end_logit: float = 0.0, name: str = "tiny", tokenizer_kind: str = "tiny") -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    size = SIZES[name]
    torch.manual_seed(SEED)
    tokenizer = _build_tokenizer(tokenizer_kind)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.convert_tokens_to_ids(PAD)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=4 * size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=True,
        torch_dtype="float32",
        thicket_note="RANDOM UNTRAINED weights: a test model that emits noise",
    )
    model = LlamaForCausalLM(config).eval()
    if end_logit:
        probe = tokenizer(_corpus()[0][:2000])["input_ids"]
        _favour(model, [eos, tokenizer.convert_tokens_to_ids("Ċ")], end_logit, probe)  # Ċ: byte-level BPE's "\n"
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    readme = README.format(name=name, seed=SEED, end_logit=end_logit, vocab=len(tokenizer), **asdict(size))
    if tokenizer_kind == "stdlib":
        readme = readme.replace("trained offline on a few KB of ReAct / TextCraft-like text",
                                "trained offline on the Python standard library's sources (and TextCraft-like text)")
    (out_dir / "README.md").write_text(readme)


def _save_tokenizer(out_dir: Path, kind: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(kind)
    tokenizer.save_pretrained(out_dir)
    print(f"{kind} tokenizer: {len(tokenizer)} tokens in {out_dir}")


def vllm_python(python: str | os.PathLike[str] | None = None) -> str:
    """The interpreter that has vLLM / torch: the argument, $THICKET_VLLM_PYTHON,
    the repo's .venv-vllm, else this interpreter."""
    if python:
        return str(python)
    if env := os.environ.get("THICKET_VLLM_PYTHON"):
        return env
    local = Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else sys.executable


def build_tiny_model(
    out_dir: str | os.PathLike[str], python: str | os.PathLike[str] | None = None, end_logit: float = 0.0,
    size: str = "tiny", tokenizer: str = "tiny",
) -> Path:
    """Build the random model of this size (SIZES) into out_dir (in a subprocess) and return
    the folder. end_logit > 0 raises the logits of the eos and of "\\n" by that much at every
    step, so that the model ends its lines and turns like a trained one (3.6: about 5% each).
    tokenizer: "tiny" (600 tokens) or "stdlib" (32,768, trained on the stdlib's sources)."""
    from thicket.errors import BadInput  # this file also runs as a script, outside thicket

    if size not in SIZES:
        raise BadInput(f"model size: '{size}' is not one of {', '.join(SIZES)}")
    if tokenizer not in TOKENIZERS:
        raise BadInput(f"tokenizer: '{tokenizer}' is not one of {', '.join(TOKENIZERS)}")

    interpreter = vllm_python(python)
    check = [interpreter, "-c", "import torch, transformers, tokenizers"]
    try:
        probe = subprocess.run(check, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInput(f"cannot run {interpreter} to build the tiny model: {exc}") from None
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        raise BadInput(f"{interpreter} lacks torch/transformers/tokenizers ({reason}); "
                       "set THICKET_VLLM_PYTHON to the vLLM venv's python")
    out = Path(out_dir)
    command = [interpreter, __file__, str(out), str(end_logit), size, *([tokenizer] if tokenizer != "tiny" else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInput(f"building the tiny model with {interpreter} failed: {reason}")
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--tokenizer-only"]:
        if not 2 <= len(args) <= 3 or (len(args) == 3 and args[2] not in TOKENIZERS):
            sys.exit(f"usage: python jobs/tiny_model.py --tokenizer-only OUT_DIR [{'|'.join(TOKENIZERS)}]")
        _save_tokenizer(Path(args[1]), args[2] if len(args) > 2 else "stdlib")
        sys.exit(0)
    if (not 1 <= len(args) <= 4 or (len(args) >= 3 and args[2] not in SIZES)
            or (len(args) == 4 and args[3] not in TOKENIZERS)):
        sys.exit(f"usage: python jobs/tiny_model.py OUT_DIR [END_LOGIT [{'|'.join(SIZES)} [{'|'.join(TOKENIZERS)}]]]")
    _build(Path(args[0]), float(args[1]) if len(args) > 1 else 0.0, args[2] if len(args) > 2 else "tiny",
           args[3] if len(args) > 3 else "tiny")
