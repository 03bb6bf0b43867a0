"""What the action grammar costs vLLM's grammar engine (xgrammar, vLLM's default backend):
compile time per distinct set of valid actions, and matching time per generated token, for a
bounded thought ([^\\n]{0,N}) against an unbounded one ([^\\n]*), over vocabulary sizes; and
the parse that vLLM's API server runs on every request's grammar before accepting it, for the
EBNF grammar thicket sends against the same language as a regex.

    .venv-vllm/bin/python bench/grammar.py [--vocab 600 8000 32000] [--actions 30 200] [--bounds 24 200]

Tokenizers are byte-level BPEs trained at start on this repository's text (nothing is
downloaded), so the largest vocabulary is what that text supports. Matching is timed over
the tokens of a fixed thought, as vLLM does for each sequence at each step: fill the
next-token bitmask, then accept the sampled token.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import transformers
import xgrammar
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[1]
VERBS = ("open", "close", "move", "focus on", "pick up", "look at", "activate", "deactivate", "pour", "mix")
OBJECTS = ("door", "sink", "stove", "cup containing water", "thermometer", "red box", "blue box", "table",
           "chair", "fridge", "oven", "painting", "drawer", "counter", "freezer", "lighter", "bowl", "jug",
           "flower pot 1", "seed jar")
THOUGHT = "Thought: " + "I should look for the thermometer before I heat the water in the pot " * 3


def thicket_prompts() -> ModuleType:
    """thicket's prompts from this checkout: this runs in vLLM's venv, where thicket is not
    installed, so the package folder is linked in under its import name."""
    try:
        from thicket.policy import prompts
    except ModuleNotFoundError:
        link = Path(tempfile.mkdtemp(prefix="thicket-bench-")) / "thicket"
        link.symlink_to(ROOT / "jobs")
        sys.path.insert(0, str(link.parent))
        from thicket.policy import prompts
    return prompts


def corpus() -> list[str]:
    files = [p for pattern in ("**/*.py", "**/*.md", "**/*.yaml") for p in ROOT.glob(pattern)]
    return [p.read_text(errors="replace") for p in files if ".venv" not in p.parts]


def tokenizer(vocab: int, texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"])
    bpe.train_from_iterator(texts, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")


def as_regex(actions: tuple[str, ...], thought: str) -> str:
    """The action grammar's language as a regex (only regex metacharacters escaped)."""
    literals = "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", a) for a in actions)
    return f"Thought: {thought}\\nAction: ({literals})"


def parse_ms(parse: Callable[[str], object], text: str, times: int = 20) -> float:
    started = time.perf_counter()
    for _ in range(times):
        parse(text)
    return (time.perf_counter() - started) / times * 1000


def measure(compiler: xgrammar.GrammarCompiler, info: xgrammar.TokenizerInfo, ebnf: str,
            ids: list[int]) -> tuple[float, float, int]:
    """(compile ms, matching us a token, tokens matched)."""
    started = time.perf_counter()
    grammar = compiler.compile_grammar(ebnf)
    compile_ms = (time.perf_counter() - started) * 1000
    matcher = xgrammar.GrammarMatcher(grammar)
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    matched, started = 0, time.perf_counter()
    for token in ids:
        matcher.fill_next_token_bitmask(bitmask)
        if not matcher.accept_token(token):
            break
        matched += 1
    return compile_ms, (time.perf_counter() - started) / max(matched, 1) * 1e6, matched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[600, 8000, 32000])
    parser.add_argument("--actions", type=int, nargs="+", default=[30, 200])
    parser.add_argument("--bounds", type=int, nargs="+", default=[24, 200], help="max_thought_chars to try (0 is always tried)")
    args = parser.parse_args()
    prompts = thicket_prompts()
    texts = corpus()
    actions = tuple(f"{verb} {obj}" for verb in VERBS for obj in OBJECTS)
    for vocab in args.vocab:
        tok = tokenizer(vocab, texts)
        info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)  # every set of actions is new
        ids = tok.encode(THOUGHT, add_special_tokens=False)
        for count in args.actions:
            for bound in [0, *args.bounds]:
                ebnf, thought = prompts.action_grammar(actions[:count], bound), prompts.thought_rule(bound)
                compile_ms, match_us, matched = measure(compiler, info, ebnf, ids)
                check_ms = parse_ms(xgrammar.Grammar.from_ebnf, ebnf)
                regex_ms = parse_ms(xgrammar.Grammar.from_regex, as_regex(actions[:count], thought))
                print(f"vocab {len(tok):6,d}  actions {count:4d}  thought {thought:13s} "
                      f"compile {compile_ms:8.1f} ms  match {match_us:7.1f} us a token (over {matched} tokens)  "
                      f"request check {check_ms:.3f} ms (as a regex {regex_ms:.3f} ms)", flush=True)


if __name__ == "__main__":
    main()
