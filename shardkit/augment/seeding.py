"""The per-op generators of a batch, ``Generator(PCG64([seed, epoch, index, op]))``, without building them.

Building a ``PCG64`` from a seed list runs numpy's ``SeedSequence`` (a hash over uint32 words, in
Python-level loops under ``np.errstate``) and costs ~30 µs; a batch of 32 samples with 5 ops paid
~5 ms for it. Here the same hash runs once for a whole batch, vectorised over (sample, op) with
numpy uint32 arithmetic, the PCG64 seeding step (``pcg64_set_seed``) follows on Python integers,
and one reused ``Generator`` is moved to each state by assigning ``bit_generator.state``. The
generators are the same, so every draw is bit-identical to constructing them
(``tests/augment/test_seeding.py`` compares the two over many seeds, epochs and indices).

The constants and steps are numpy's (``numpy/random/bit_generator.pyx``: ``SeedSequence.mix_entropy``,
``generate_state``; ``pcg64.h``: ``pcg_setseq_128_srandom_r``), stable since numpy 1.17.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_XSHIFT = 16
_POOL = 4  # SeedSequence's default pool_size
_M32, _M128 = 0xFFFFFFFF, (1 << 128) - 1
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341  # PCG_DEFAULT_MULTIPLIER_128


def _words(n: int) -> list[int]:
    """A non-negative integer as SeedSequence reads it: little-endian uint32 words, ``[0]`` for 0."""
    if n < 0:
        raise ValueError(f"seeds must be non-negative, got {n}")
    out = []
    while n:
        out.append(n & _M32)
        n >>= 32
    return out or [0]


@functools.lru_cache(maxsize=16)
def _hash_steps(init: int, mult: int, count: int) -> tuple[tuple[int, int], ...]:
    """The running hash constant before and after each call: numpy multiplies it on every call, whatever
    the data, so the sequence is fixed."""
    out, c = [], init
    for _ in range(count):
        out.append((c, (c * mult) & _M32))
        c = out[-1][1]
    return tuple(out)


# The hash below runs on words that are Python ints (one seed) or uint32 arrays (one word of many seeds):
# the same operators, wrapping modulo 2**32 either way (arrays wrap by themselves; `& _M32` masks the ints).
def _hashmix(value: Any, steps: tuple[int, int]) -> Any:
    v = ((value ^ steps[0]) * steps[1]) & _M32
    return v ^ (v >> _XSHIFT)


def _mix(x: Any, y: Any) -> Any:
    r = (x * _MIX_L - y * _MIX_R) & _M32
    return r ^ (r >> _XSHIFT)


def _generate(words: Sequence[Any], zero: Any) -> list[Any]:
    """SeedSequence: ``mix_entropy`` of the entropy ``words`` into the pool, then ``generate_state(8)``."""
    length = len(words)
    steps = iter(_hash_steps(_INIT_A, _MULT_A, _POOL * _POOL + max(0, length - _POOL) * _POOL))
    mixer = [_hashmix(words[i] if i < length else zero, next(steps)) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                mixer[dst] = _mix(mixer[dst], _hashmix(mixer[src], next(steps)))
    for src in range(_POOL, length):
        for dst in range(_POOL):
            mixer[dst] = _mix(mixer[dst], _hashmix(words[src], next(steps)))
    return [_hashmix(mixer[i % _POOL], st) for i, st in enumerate(_hash_steps(_INIT_B, _MULT_B, 8))]


#: Up to this many seeds, the hash runs on Python ints, one seed at a time (fewer, cheaper operations).
_SMALL = 8


def seed_words(entropy: np.ndarray) -> np.ndarray:
    """(n, L) uint32 entropy words → (n, 8) uint32: ``SeedSequence(words).generate_state(8)`` for each row."""
    ent = np.asarray(entropy, np.uint32)
    n, length = ent.shape
    if n <= _SMALL:
        return np.array([_generate(row, 0) for row in ent.tolist()], np.uint32).reshape(n, 8)
    return np.stack(_generate([ent[:, i] for i in range(length)], np.zeros(n, np.uint32)), axis=1)


def pcg64_states(words: np.ndarray) -> list[dict[str, object]]:
    """(n, 8) seed words (``generate_state(8)``) → the state dicts of ``PCG64`` seeded with each row."""
    w = np.asarray(words, np.uint64)
    u64 = (w[:, 0::2] | (w[:, 1::2] << np.uint64(32))).tolist()  # generate_state(4, np.uint64), little-endian
    out = []
    for s0, s1, q0, q1 in u64:
        inc = ((((q0 << 64) | q1) << 1) | 1) & _M128
        state = ((((inc + ((s0 << 64) | s1)) & _M128) * _PCG_MULT) + inc) & _M128  # srandom_r: step, add, step
        out.append({"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0,
                    "uinteger": 0})
    return out


def op_states(seed: int, epoch: int, indices: Sequence[int] | np.ndarray, n_ops: int) -> list[list[dict[str, object]]]:
    """``[sample][op]`` PCG64 states equal to ``PCG64([seed, epoch, index, op]).state``, for every index."""
    head = _words(int(seed)) + _words(int(epoch))
    idx = [int(i) for i in np.asarray(indices).reshape(-1)]
    out: list[dict[str, object]] = [{}] * (len(idx) * n_ops)
    groups: dict[int, list[int]] = {}  # samples by how many words their index takes
    for s, i in enumerate(idx):
        groups.setdefault(len(_words(i)), []).append(s)
    ops = np.arange(n_ops, dtype=np.uint32)
    for nw, where in groups.items():
        ent = np.empty((len(where), n_ops, len(head) + nw + 1), np.uint32)
        ent[:, :, : len(head)] = head
        ent[:, :, len(head): -1] = np.array([_words(idx[s]) for s in where], np.uint32)[:, None, :]
        ent[:, :, -1] = ops
        states = pcg64_states(seed_words(ent.reshape(len(where) * n_ops, -1)))
        for j, s in enumerate(where):
            out[s * n_ops:(s + 1) * n_ops] = states[j * n_ops:(j + 1) * n_ops]
    return [out[s * n_ops:(s + 1) * n_ops] for s in range(len(idx))]


def reseed(gen: np.random.Generator, state: dict[str, object]) -> np.random.Generator:
    """``gen`` moved to ``state`` (a ``Generator`` keeps no state beside its bit generator's)."""
    gen.bit_generator.state = state
    return gen
