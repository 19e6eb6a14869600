"""Columns of strings and the pair table: the same items, order and pickles as Python objects, in fewer bytes."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest

from shardkit.conversion.pairs import PairBuilder, SamplePair
from shardkit.support.columns import StringColumn

# ASCII, separators, multi-byte UTF-8, a surrogate (an undecodable file-name byte), NUL, an astral code point
ALPHABET = ["a", "b", "/", "_", "0", ".", "ü", "é", "\udcff", "\x00", "\U0001f600"]


def random_strings(rng: random.Random, n: int) -> list[str]:
    out = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, rng.choice([2, 9, 25])))) for _ in range(n)]
    if rng.random() < 0.5:  # long shared prefixes: many rounds of the radix sort
        out = ["images/train/aachen/aachen_0000" + s for s in out]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_column_holds_its_strings_and_sorts_like_sorted(seed: int) -> None:
    rng = random.Random(seed)
    items = random_strings(rng, rng.randint(0, 80))
    col = StringColumn.from_strings(items)
    assert list(col) == items and len(col) == len(items)
    order = col.argsort()
    assert order.tolist() == sorted(range(len(items)), key=items.__getitem__)  # stable, str order
    assert list(col.take(order)) == sorted(items)
    assert col.is_sorted() == (items == sorted(items))
    assert col.take(order).is_sorted()


def test_a_slice_is_a_view_and_pickles_only_its_own_bytes() -> None:
    items = [f"train/{i:07d}.png" for i in range(10_000)]
    col = StringColumn.from_strings(items)
    part = col[5000:5003]
    assert list(part) == items[5000:5003] and part[-1] == items[5002]
    assert part == StringColumn.from_strings(items[5000:5003])
    data = pickle.dumps(part)
    assert len(data) < 400  # not the 170 KB of the whole column
    assert list(pickle.loads(data)) == items[5000:5003]


def test_a_pair_table_gives_the_same_pairs_sorted_by_key(tmp_path: Path) -> None:
    builder = PairBuilder(tmp_path)
    names = ["b", "a0", "a", "ü", "a.b"]
    for name in names:
        builder.add(f"img/{name}.png", f"{tmp_path}/img/{name}.png", f"{tmp_path}/lab/{name}_L.png")
    table = builder.build()
    expected = [SamplePair(f"img/{n}.png", tmp_path / f"img/{n}.png", tmp_path / f"lab/{n}_L.png")
                for n in sorted(names, key=lambda n: f"img/{n}.png")]
    assert list(table) == expected and table[1:3] == builder_of(tmp_path, expected[1:3])
    assert pickle.loads(pickle.dumps(table[1:3])) == table[1:3]
    # every image and label path, in the order sorted() gives the paths (the fingerprint cache file's order)
    files = [(str(p.image if side == 0 else p.label), i, side) for i, p in enumerate(expected) for side in (0, 1)]
    assert list(table.files_in_path_order()) == sorted(files)


def builder_of(root: Path, pairs: list[SamplePair]):  # type: ignore[no-untyped-def]
    b = PairBuilder(root)
    for p in pairs:
        b.add(p.key, str(p.image), str(p.label))
    return b.build()


def test_a_pair_table_of_many_pairs_holds_about_its_bytes(tmp_path: Path) -> None:
    """The point of the table: ~60 bytes a pair (CamVid-like names), where SamplePairs of Paths took ~500."""
    n = 20_000
    builder = PairBuilder(tmp_path)
    for i in range(n):
        builder.add(f"train/{i:07d}.png", f"{tmp_path}/train/{i:07d}.png", f"{tmp_path}/trainannot/{i:07d}.png")
    table = builder.build()
    held = table.keys.nbytes + table.labels.nbytes + 2 * 8 * (n + 1)
    assert held / n < 60
    assert table.images is table.keys  # POSIX: an image's relative path is its key, stored once
    assert len(pickle.dumps(table[5:15])) < 1000  # a shard task sends its own rows, not the split's ~1 MB
    assert np.array_equal(table.keys.argsort(), np.arange(n))
