"""Host memory for a pod's vLLM, from the size its model's name gives (e.g. Llama-3.1-8B-Instruct,
Qwen2.5-0.5B, Mixtral-8x7B, SmolLM-135M).

vLLM reads the weights into host memory on their way to the GPU (its safetensors files are mapped
into the page cache, which the container's memory limit counts), and each of its processes (the
API server, the engine core, one worker per GPU) holds torch, CUDA's context and the tokenizer.
The estimate is the weights at the precision the name says (bf16 unless it names fp8, int8 or a
4-bit format), plus a base and a share per GPU, rounded up to 4 GiB. A name that gives no size
gets DEFAULT_GIB; `cluster.resources.vllm` overrides all of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DEFAULT_GIB = 32
BASE_GIB = 6  # the API server and engine core processes, torch and the tokenizer
PER_GPU_GIB = 2  # each GPU worker process: torch, CUDA's context, pinned buffers
MIN_GIB = 16

# A size in a model's name: 8B, 0.5B, 135M, 8x7B (experts x size), not the A3B (active) of an MoE.
SIZE = re.compile(r"(?<![a-z0-9.])(?:(?P<experts>\d+)x)?(?P<count>\d+(?:\.\d+)?)(?P<unit>[bm])(?![a-z0-9])", re.I)
BYTES_PER_PARAMETER = (  # the first hint found in the name, else bf16
    (re.compile(r"awq|gptq|int4|4bit|w4a16|nf4|bnb", re.I), 0.5),
    (re.compile(r"fp8|int8|8bit|w8a8", re.I), 1.0),
)


@dataclass(frozen=True)
class MemoryEstimate:
    gib: int
    parameters_b: float | None  # billions of parameters the name gives; None: not found

    @property
    def quantity(self) -> str:
        return f"{self.gib}Gi"


def parameters_b(model: str) -> float | None:
    """Billions of parameters, from the model's name (its last path part); None when it says none."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    found = [
        (int(match["experts"] or 1) * float(match["count"])) / (1000 if match["unit"].lower() == "m" else 1)
        for match in SIZE.finditer(name)
    ]
    return max(found) if found else None


def bytes_per_parameter(model: str) -> float:
    for hint, size in BYTES_PER_PARAMETER:
        if hint.search(model):
            return size
    return 2.0


def vllm_memory(model: str, gpus: int) -> MemoryEstimate:
    """The vLLM container's memory request (= limit) for `model` on `gpus` GPUs."""
    billions = parameters_b(model)
    if billions is None:
        return MemoryEstimate(DEFAULT_GIB, None)
    weights_gib = billions * 1e9 * bytes_per_parameter(model) / 2**30
    need = weights_gib + BASE_GIB + PER_GPU_GIB * max(gpus, 1)
    return MemoryEstimate(max(MIN_GIB, 4 * math.ceil(need / 4)), billions)
