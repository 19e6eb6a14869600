"""scripts/augment_peers.py (#43 must-have 7): the augmentation benchmarks refuse a peer pipeline the peer warned
about (an argument it ignores, a deprecated name) instead of timing a different pipeline, and name the version."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("augment_peers", ROOT / "scripts" / "augment_peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["augment_peers"] = module
    spec.loader.exec_module(module)
    return module


def ignored_argument() -> None:
    """What albumentations does with a parameter name it no longer knows: warn, then run its default."""
    warnings.warn("Argument(s) 'scale_limit' are not valid for transform RandomScale", UserWarning, stacklevel=1)


def test_a_warning_while_building_refuses_naming_peer_version_and_warning() -> None:
    peers = script()
    with pytest.raises(peers.PeerRefused) as info, peers.strict_peer("no_such_peer_module"):
        ignored_argument()
    said = str(info.value)
    assert "no_such_peer_module (version unknown)" in said
    assert "UserWarning: Argument(s) 'scale_limit' are not valid for transform RandomScale" in said
    assert "refusing to benchmark" in said


def test_refuses_even_when_the_caller_silences_warnings() -> None:
    """``python -W ignore`` or an outer ``simplefilter("ignore")`` must not let a changed pipeline through."""
    peers = script()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(peers.PeerRefused), peers.strict_peer("no_such_peer_module", "first call"):
            warnings.warn("deprecated: use fill_mask", DeprecationWarning, stacklevel=1)


def test_every_warning_is_listed_and_a_quiet_block_passes() -> None:
    peers = script()
    with pytest.raises(peers.PeerRefused) as info, peers.strict_peer("no_such_peer_module"):
        ignored_argument()
        warnings.warn("value is deprecated, use fill", FutureWarning, stacklevel=1)
    assert "scale_limit" in str(info.value) and "FutureWarning: value is deprecated, use fill" in str(info.value)
    with peers.strict_peer("no_such_peer_module"):
        built = [1, 2, 3]
    assert built == [1, 2, 3]


def test_peer_version_names_the_installed_distribution() -> None:
    """The maintained albumentations line installs as ``albumentationsx``; the version printed names which."""
    peers = script()
    assert peers.peer_version("pytest") == f"pytest {pytest.__version__}"
    assert peers.DISTRIBUTIONS["albumentations"][0] == "albumentationsx"
