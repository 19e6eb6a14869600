"""The batched generator seeding (shardkit.augment.seeding) gives numpy's own PCG64([seed, epoch, index, op])."""

from __future__ import annotations

import numpy as np
import pytest

from shardkit import augment as A
from shardkit.augment import ops as O
from shardkit.augment import seeding

SEEDS = [(0, 0), (1, 2), (3, 1), (123456789, 41), (2**32 - 1, 2**32 - 1), (2**32, 5), (2**70 + 3, 2**33)]
INDICES = [*range(64), 999, 123457, 2**31, 2**32 - 1, 2**32, 2**40 + 7, 2**63 - 1]


@pytest.mark.parametrize(("seed", "epoch"), SEEDS)
def test_op_states_are_numpys_pcg64_states(seed: int, epoch: int) -> None:
    got = seeding.op_states(seed, epoch, INDICES, 7)
    assert len(got) == len(INDICES)
    for s, i in enumerate(INDICES):
        assert got[s] == [np.random.PCG64([seed, epoch, i, k]).state for k in range(7)], i


def test_seed_words_are_seedsequence_words_for_any_entropy_length() -> None:
    rng = np.random.default_rng(5)
    for length in (1, 2, 3, 4, 5, 6, 9):
        ent = rng.integers(0, 2**32, (50, length), dtype=np.uint64).astype(np.uint32)
        ent[:5] = 0
        want = np.stack([np.random.SeedSequence([int(v) for v in row]).generate_state(8) for row in ent])
        np.testing.assert_array_equal(seeding.seed_words(ent), want)


def test_a_reseeded_generator_draws_what_a_new_one_draws() -> None:
    gen = np.random.Generator(np.random.PCG64(0))
    gen.random(3)  # leave it mid-stream, with a buffered 32-bit half
    gen.integers(0, 10, dtype=np.uint32)
    for k, state in enumerate(seeding.op_states(7, 3, [11], 4)[0]):
        ref = np.random.Generator(np.random.PCG64([7, 3, 11, k]))
        seeding.reseed(gen, state)
        assert gen.integers(0, 1000, 5, dtype=np.uint32).tolist() == ref.integers(0, 1000, 5, dtype=np.uint32).tolist()
        assert gen.uniform(-1, 1, 4).tolist() == ref.uniform(-1, 1, 4).tolist()


def _params_one_generator_per_op(aug: A.Compose, index: int, seed: int, epoch: int, hw: tuple[int, int],
                                 label: np.ndarray | None = None) -> A.Params:
    """The draws as they were first written: a new Generator(PCG64([seed, epoch, index, k])) per op."""
    st = O._State(hw, label, 11)
    for k, op in enumerate(aug.ops):
        op.draw(np.random.Generator(np.random.PCG64([seed, epoch, index, k])), st)
    return A.Params(matrix=st.t[:2].copy(), out_hw=st.hw, **st.values)


@pytest.mark.parametrize("spec", ["scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2",
                                  "scale=0.7:1.5,crop=200x300,hflip=0.3,rotate=30,jitter=0.2:0.3:0.4:0.1,"
                                  "cutout=0-3:40x60:128:ignore"])
def test_params_equal_the_one_generator_per_op_draws(spec: str) -> None:
    aug = A.parse(spec)
    for seed, epoch in SEEDS[:5]:
        got = aug.params_batch(INDICES, seed=seed, epoch=epoch, hws=[(360, 480)] * len(INDICES))
        for i, p in zip(INDICES, got, strict=True):
            want = _params_one_generator_per_op(aug, i, seed, epoch, (360, 480))
            assert p == want
            assert p.matrix.tobytes() == want.matrix.tobytes()  # bit for bit
            assert aug.params(i, seed=seed, epoch=epoch, hw=(360, 480)) == want


def test_cat_max_ratio_redraws_are_the_same_too() -> None:
    aug = A.parse("scale=0.5:2,crop=100x120:0.5,hflip")
    label = np.zeros((360, 480), np.uint8)
    label[:, 400:] = 3  # one class covers most crops: re-draws happen
    got = aug.params_batch(range(40), seed=9, epoch=2, hws=[label.shape] * 40, labels=[label] * 40)
    for i, p in enumerate(got):
        assert p == _params_one_generator_per_op(aug, i, 9, 2, label.shape, label)


def test_negative_seeds_are_refused_as_numpy_refuses_them() -> None:
    with pytest.raises(ValueError):
        A.parse("hflip").params(-1, hw=(4, 4))
    with pytest.raises(ValueError):
        np.random.PCG64([0, 0, -1, 0])
