"""Shard planning: limits respected, boundaries content-defined and stable under insertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shardkit.conversion.plan import cut_shards


def keys(n: int, prefix: str = "img") -> list[str]:
    return [f"{prefix}/{i:06d}.png" for i in range(n)]


def test_shards_never_exceed_the_sample_limit_and_cover_everything() -> None:
    lengths = cut_shards([1] * 5000, keys(5000), 100, None)
    assert sum(lengths) == 5000 and max(lengths) <= 100
    assert min(lengths[:-1]) >= 50, "a shard ends early only after half its limit"
    assert 65 <= 5000 / len(lengths) <= 90, "about three quarters full on average"


def test_byte_limit_is_respected_with_variable_sizes() -> None:
    sizes = [(i % 7 + 1) * 1000 for i in range(3000)]
    lengths = cut_shards(sizes, keys(3000), None, 50_000)
    start = 0
    for n in lengths:
        assert n == 1 or sum(sizes[start : start + n]) <= 50_000
        start += n
    assert start == 3000


def test_inserting_one_sample_changes_only_the_shards_around_it() -> None:
    base = keys(4000)
    grown = sorted([*base, "img/002000a.png"])

    def shards(ks: list[str]) -> set[tuple[str, ...]]:
        out, start = set(), 0
        for n in cut_shards([1] * len(ks), ks, 100, None):
            out.add(tuple(ks[start : start + n]))
            start += n
        return out

    before, after = shards(base), shards(grown)
    assert len(before - after) <= 2, "only the shard holding the new sample (and at most its neighbour) changes"
    assert len(before & after) >= len(before) - 2


def test_plan_is_the_same_in_every_process() -> None:
    """Boundaries come from the keys' content, never from per-process state such as str hash randomisation."""
    ks = keys(1234)
    here = cut_shards([1] * 1234, ks, 64, None)
    code = ("import json, sys; from shardkit.conversion.plan import cut_shards; ks = json.load(sys.stdin); "
            "print(json.dumps(cut_shards([1] * len(ks), ks, 64, None)))")
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", code], input=json.dumps(ks), capture_output=True, text=True,
                             env=env, check=True)
        assert json.loads(run.stdout) == here
    assert len(here) > 1 and sum(here) == 1234
