"""Train the demo policy: a small Llama-shaped chat model, by supervised fine-tuning on expert
conversations (JSONL of {"task", "messages"}), with torch on the CPU, into a folder vLLM serves.

    python jobs/training/train_policy.py CONVERSATIONS.jsonl OUT_DIR SETTINGS_JSON

Runs with the interpreter that has torch, transformers and tokenizers (the vLLM venv); it
imports nothing of thicket but the chat template of the tiny model (jobs/tiny_model.py), so
the trained model renders chats exactly as the random one does. The tokenizer (byte-level
BPE) is trained on the conversations' text. Loss is on the assistant turns and the end of
turn after each. Everything is seeded and runs on a fixed number of threads and steps, so a
rerun on the same machine gives the same weights.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # jobs/: tiny_model, without thicket

from tiny_model import CHAT_TEMPLATE, IM_END, IM_START, PAD  # noqa: E402


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    vocab: int = 2048  # at most; BPE stops earlier on this text
    hidden: int = 128
    layers: int = 4
    heads: int = 4  # head_dim 32: the smallest vLLM's CPU attention accepts
    kv_heads: int = 2
    max_positions: int = 2048
    steps: int = 1200
    batch_tokens: int = 4096  # padded tokens per step, about
    learning_rate: float = 3e-3
    warmup: int = 20
    threads: int = 2
    # bfloat16 autocast, as the committed TextCraft demo was trained. On a CPU without native
    # bfloat16 it is ~13x slower than float32 on long chats: one 2 x 1,377-token step took
    # 6.9 s against 0.5 s on the 2-core development machine.
    bf16: bool = True


def load_chats(path: Path) -> list[list[dict[str, str]]]:
    return [json.loads(line)["messages"] for line in path.read_text().splitlines() if line.strip()]


def build_tokenizer(chats: list[list[dict[str, str]]], settings: Settings):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=settings.vocab, special_tokens=[PAD, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((m["content"] for chat in chats for m in chat), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token=IM_END, pad_token=PAD,
                                   additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE,
                                   model_max_length=settings.max_positions)


def encode(tokenizer, chat: list[dict[str, str]], max_positions: int) -> tuple[list[int], list[int]]:
    """(token ids of the rendered chat, loss mask): 1 on each assistant turn's content and the
    end-of-turn token after it, as the model samples them at rollout."""
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    spans, start = [], 0
    for message in chat:
        head = f"{IM_START}{message['role']}\n"
        begin = text.index(head, start) + len(head)
        end = begin + len(message["content"]) + len(IM_END)
        if message["role"] == "assistant":
            spans.append((begin, end))
        start = end
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    mask = [int(any(lo <= a and b <= hi for lo, hi in spans)) for a, b in encoded["offset_mapping"]]
    return encoded["input_ids"][:max_positions], mask[:max_positions]


def examples_of(tokenizer, chat: list[dict[str, str]], max_positions: int) -> list[tuple[list[int], list[int]]]:
    """A chat's training examples: itself when it fits; else its head (cut at max_positions)
    and its tail as a rollout prompts it, the oldest exchanges after the system and task
    messages dropped until it fits (the policy drops them so on a context-length refusal)."""
    whole = encode(tokenizer, chat, max_positions + 1)
    if len(whole[0]) <= max_positions:
        return [whole]
    head = (whole[0][:max_positions], whole[1][:max_positions])
    tail = chat
    while len(tail) > 4:
        tail = [*tail[:2], *tail[4:]]  # system, task, then drop one assistant + user exchange
        ids, mask = encode(tokenizer, tail, max_positions + 1)
        if len(ids) <= max_positions:
            return [head, (ids, mask)]
    return [head]


def batches(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by length (little padding), about batch_tokens padded tokens a group."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > batch_tokens:
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    rng.shuffle(out)
    return out


def model_for(tokenizer, settings: Settings):  # -> LlamaForCausalLM
    from transformers import LlamaConfig, LlamaForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=settings.hidden,
                         intermediate_size=4 * settings.hidden, num_hidden_layers=settings.layers,
                         num_attention_heads=settings.heads, num_key_value_heads=settings.kv_heads,
                         max_position_embeddings=settings.max_positions, bos_token_id=None, eos_token_id=eos,
                         pad_token_id=pad, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def tensors(examples: list[tuple[list[int], list[int]]], group: list[int], pad: int):
    import torch

    width = max(len(examples[i][0]) for i in group)
    ids = torch.full((len(group), width), pad, dtype=torch.long)
    labels = torch.full((len(group), width), -100, dtype=torch.long)
    for row, i in enumerate(group):
        tokens, mask = examples[i]
        ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, : len(tokens)] = torch.tensor([t if m else -100 for t, m in zip(tokens, mask)])
    return ids, labels


def train(model, examples: list[tuple[list[int], list[int]]], pad: int, settings: Settings) -> list[float]:
    """Fixed steps over length-grouped batches, AdamW with warmup and cosine decay; the loss of each step."""
    import torch

    rng = random.Random(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.01)

    def rate(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / settings.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - settings.warmup) / max(settings.steps - settings.warmup, 1)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    queue: list[list[int]] = []
    losses = []
    model.train()
    for _ in range(settings.steps):
        if not queue:
            queue = batches([len(e[0]) for e in examples], settings.batch_tokens, rng)
        ids, labels = tensors(examples, queue.pop(), pad)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if len(losses) % 50 == 0:
            print(f"step {len(losses)}: loss {sum(losses[-50:]) / 50:.4f}", file=sys.stderr, flush=True)
    return losses


def main(chats_path: Path, out_dir: Path, settings: Settings) -> dict[str, object]:
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.threads)
    started = time.perf_counter()
    chats = load_chats(chats_path)
    tokenizer = build_tokenizer(chats, settings)
    examples = [example for chat in chats for example in examples_of(tokenizer, chat, settings.max_positions)]
    pad = tokenizer.convert_tokens_to_ids(PAD)
    model = model_for(tokenizer, settings)
    losses = train(model, examples, pad, settings)
    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=model.config.eos_token_id, pad_token_id=pad)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out_dir)  # half the bytes; vLLM serves it in float32
    tokenizer.save_pretrained(out_dir)
    tokens = sum(len(e[0]) for e in examples)
    return {
        "settings": asdict(settings),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "conversations": len(chats),
        "examples": len(examples),
        "tokens": tokens,
        "loss_tokens": sum(sum(e[1]) for e in examples),
        "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "train_seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python jobs/training/train_policy.py CONVERSATIONS.jsonl OUT_DIR SETTINGS_JSON")
    summary = main(Path(sys.argv[1]), Path(sys.argv[2]), Settings(**json.loads(sys.argv[3])))
    print(json.dumps(summary))
