"""Content keys: per node, 64-bit hashes of the exact chat texts up to it, equal for equal
texts in any forest, tree or run (so that rows of different trees can be compared).

turn(v): the chat up to and including the reply that led to v (the system prompt, the root's
  observation, then each step's reply and observation, ending on v's reply);
chat(v): turn(v) then v's observation (the prompt v's children were sampled from);
  at a root, the system prompt and its observation.
Texts are hashed with BLAKE2b (once per distinct text), and combined along paths with a
mixing function, level by level for a whole forest at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thicket.aggregate.forest import Forest

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def text_hashes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row, a 64-bit hash of its text (each distinct text hashed once)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    encoded = pc.dictionary_encode(pc.cast(array, pa.string()))
    words = [
        int.from_bytes(hashlib.blake2b((text or "").encode(), digest_size=8).digest(), "little")
        for text in encoded.dictionary.to_pylist()
    ]
    return np.array(words, dtype=np.uint64)[encoded.indices.to_numpy(zero_copy_only=False)]


def mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An order-sensitive 64-bit combination of two hashes (splitmix64's finaliser over a*phi ^ b)."""
    with np.errstate(over="ignore"):
        z = (a * _GOLDEN) ^ b
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


@dataclass(frozen=True)
class ContentKeys:
    turn: np.ndarray  # uint64 per node (at the roots: their chat)
    chat: np.ndarray  # uint64 per node

    @classmethod
    def of(cls, forest: Forest) -> ContentKeys:
        table = forest.table
        system = text_hashes(table.column("system_prompt").take(pa.array(forest.roots)))
        user = text_hashes(table.column("user_message"))
        reply = text_hashes(table.column("reply"))
        turn = np.zeros(forest.size, dtype=np.uint64)
        chat = np.zeros(forest.size, dtype=np.uint64)
        roots = forest.roots
        chat[roots] = mix(system, user[roots])
        turn[roots] = chat[roots]
        for level in forest.levels[1:]:
            turn[level] = mix(chat[forest.parent[level]], reply[level])
            chat[level] = mix(turn[level], user[level])
        return cls(turn, chat)


@dataclass(frozen=True)
class PairKeys:
    """Per preference row, its content (the two sides' turn keys, smaller first: the same for
    A-over-B and B-over-A) and its direction (whether chosen is the smaller)."""

    low: np.ndarray
    high: np.ndarray
    forward: np.ndarray

    @classmethod
    def of(cls, keys: ContentKeys, chosen: np.ndarray, rejected: np.ndarray) -> PairKeys:
        a, b = keys.turn[chosen], keys.turn[rejected]
        return cls(np.minimum(a, b), np.maximum(a, b), a < b)

    @classmethod
    def concat(cls, parts: list[PairKeys]) -> PairKeys:
        if not parts:
            empty = np.zeros(0, dtype=np.uint64)
            return cls(empty, empty, np.zeros(0, dtype=bool))
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("low", "high", "forward")))

    def __len__(self) -> int:
        return len(self.low)

    def verdict(self) -> tuple[np.ndarray, int, int]:
        """(rows to keep, rows dropped as contradictions, rows dropped as repeats): a pair
        whose two sides appear both ways round is dropped everywhere; a pair seen again the
        same way round is kept once (its first row)."""
        if not len(self):
            return np.zeros(0, dtype=bool), 0, 0
        _, first, group = np.unique(np.c_[self.low, self.high], axis=0, return_index=True, return_inverse=True)
        group = group.ravel()
        forward = np.bincount(group, self.forward).astype(np.int64)
        total = np.bincount(group)
        contradicted = (forward > 0) & (forward < total)
        keep = np.zeros(len(self), dtype=bool)
        keep[first] = True
        keep &= ~contradicted[group]
        conflicts = int(contradicted[group].sum())
        return keep, conflicts, len(self) - int(keep.sum()) - conflicts
