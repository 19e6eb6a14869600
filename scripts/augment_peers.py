"""The augmentation benchmarks' peers (albumentations, torchvision, Kornia): which release each row compared, and a
guard that refuses to benchmark a peer pipeline the peer changed behind our back.

A peer that renames a parameter often keeps the old name working with a warning ("Argument(s) 'scale_limit' are not
valid for transform RandomScale") and runs its default instead: the benchmark would then time a different pipeline and
print a ratio that compares nothing. :func:`strict_peer` turns every warning raised while a peer pipeline is built and
first run into :class:`PeerRefused`, naming the peer, its version and each warning; the scripts stop there.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# the maintained albumentations line is published as ``albumentationsx`` and imports as ``albumentations``
DISTRIBUTIONS = {"albumentations": ("albumentationsx", "albumentations"), "torchvision": ("torchvision",),
                 "kornia": ("kornia",)}


class PeerRefused(RuntimeError):
    """A peer warned while its benchmark pipeline was built or first run: the pipeline is not the one asked for."""


def peer_version(module: str) -> str:
    """``"<distribution> <version>"`` of the installed package that provides ``module`` (e.g. ``"albumentationsx
    2.5.1"`` for ``albumentations``), or ``"<module> (version unknown)"``."""
    for dist in DISTRIBUTIONS.get(module, (module,)):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"{module} (version unknown)"


def quiet_albumentations() -> None:
    """No usage statistics from AlbumentationsX while benchmarking (its documented opt-out; set before import)."""
    os.environ.setdefault("ALBUMENTATIONS_NO_TELEMETRY", "1")
    os.environ.setdefault("ALBUMENTATIONS_OFFLINE", "1")


@contextmanager
def strict_peer(module: str, what: str = "pipeline") -> Iterator[None]:
    """Run the block with every warning recorded; any warning at all -> :class:`PeerRefused` naming ``module``'s
    installed version and each warning (category, message, where), so the benchmark refuses to run rather than time a
    pipeline the peer silently changed (an ignored or deprecated argument, a changed default)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    if caught:
        said = "; ".join(f"{w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})"
                         for w in caught)
        raise PeerRefused(f"{peer_version(module)} warned while building/first running the benchmark's {what}: "
                          f"{said}; refusing to benchmark a pipeline that may not be the one asked for "
                          f"(fix: speak this version's parameter names in scripts/bench_augment.py, or install the "
                          f"version scripts/README.md names)")
