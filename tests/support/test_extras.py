"""Install hints name packages pip can find (the extra's own requirements), never ``shardkit[...]`` from the index."""

from __future__ import annotations

from importlib import metadata

import pytest

from shardkit.codecs import registry as codecs
from shardkit.errors import ConfigError
from shardkit.support.extras import install_hint


def test_install_hint_names_the_extras_packages() -> None:
    hint = install_hint("codecs")
    assert hint.startswith("pip install ") and "shardkit[" not in hint
    for name in ("zstandard", "lz4", "hdf5plugin"):
        assert f'"{name}>=' in hint, hint
    assert install_hint("s3").count('"') == 4 and "s3fs" in install_hint("s3")


def test_install_hint_without_metadata_points_at_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(_name: str) -> list[str]:
        raise metadata.PackageNotFoundError("shardkit")

    monkeypatch.setattr(metadata, "requires", missing)
    assert install_hint("codecs") == 'pip install -e ".[codecs]" in a shardkit checkout'


def test_a_missing_codec_library_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "no_such_codec_lib", None)  # import raises ModuleNotFoundError
    with pytest.raises(ConfigError) as err:
        codecs.require("no_such_codec_lib", "zstd")
    assert 'pip install "zstandard>=' in str(err.value) and "shardkit[" not in str(err.value)
