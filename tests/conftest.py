"""Shared fixtures: where the real data lives, and small synthetic datasets.

Real-data tests never skip: if ``../shared/data`` (or ``$SHARDKIT_TEST_DATA``) is
missing, they fail loudly, because CI must exercise them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _threads_per_worker() -> None:
    """Each xdist worker gets its share of the cores for the libraries' thread pools (OpenMP: torch's intra-op
    pool, OpenBLAS; TensorFlow's intra- and inter-op pools), unless the caller set the variable: two workers of two
    threads each on two cores made torch's spinning pool 5-15x slower per operation (a uint8 warp of 3x4x256x384:
    0.04 s alone, 0.6 s so), and TensorFlow's (Eigen's pool spins too) about 2x slower (tests/augment/test_tf.py
    with tests/read/test_tf_jpeg_bands.py under ``-n 2``: 74-101 s, 45-67 s so). Set before any test module imports
    torch or TensorFlow; subprocesses inherit it. ``-n 0`` keeps every core."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = str(max(1, (os.cpu_count() or 1) // workers))
    for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(name, share)


_threads_per_worker()


# The one SHARDKIT_* variable the suite itself reads; every other is the caller's and is removed for the session.
TEST_DATA_ENV = "SHARDKIT_TEST_DATA"


@pytest.fixture(scope="session", autouse=True)
def hermetic_environment() -> Iterator[None]:
    """The suite passes whatever the caller's environment holds: a ``SHARDKIT_*`` variable set outside (a typo
    the CLI warns about, a format or split it would apply) is removed for the whole session, session fixtures
    included, and put back after; a test sets what it needs itself (``monkeypatch.setenv``, ``env=``).
    ``SHARDKIT_TEST_DATA`` stays: it says where the real data lives."""
    with pytest.MonkeyPatch.context() as mp:
        remove_callers_variables(mp)
        yield


def remove_callers_variables(mp: pytest.MonkeyPatch) -> None:
    """Unset every ``SHARDKIT_*`` variable but ``SHARDKIT_TEST_DATA`` through ``mp`` (which puts them back)."""
    for name in [n for n in os.environ if n.startswith("SHARDKIT_") and n != TEST_DATA_ENV]:
        mp.delenv(name)


def shared_data_dir() -> Path:
    env = os.environ.get(TEST_DATA_ENV)
    path = Path(env) if env else ROOT.parent / "shared" / "data"
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "camvid-segnet").is_dir() or not (path / "rgb-masks-mini").is_dir():
        pytest.fail(f"real test data not found at {path}; set SHARDKIT_TEST_DATA to the shared/data folder")
    return path


@pytest.fixture(scope="session")
def camvid_root(shared_data: Path) -> Path:
    return shared_data / "camvid-segnet"


@pytest.fixture(scope="session")
def camvid_val_npy(camvid_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CamVid val (26 pairs, ignore id 11) as npy shards at 360x480, 13 samples per shard (read-only for tests)."""
    from shardkit.conversion.config import ConvertConfig, ShardSize
    from shardkit.conversion.pipeline import convert

    out = tmp_path_factory.mktemp("camvid-val-npy")
    convert(ConvertConfig(camvid_root, out, format="npy", size=(360, 480), splits=("val",), workers=2,
                          quiet=True, shard_size=ShardSize(samples=13)))
    return out / "val"


@pytest.fixture(scope="session")
def rgb_masks_root(shared_data: Path) -> Path:
    return shared_data / "rgb-masks-mini"


SCHEMA_PATH = ROOT / "formats" / "manifest.schema.json"


def validate_manifest_file(path: Path) -> dict:
    """Validate one manifest.json against formats/manifest.schema.json; returns the parsed manifest."""
    import json

    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)
    return data


@pytest.fixture(scope="session")
def validate_manifest():
    """Call with a split folder or a manifest.json path; fails the test if the schema rejects it."""

    def check(path: Path) -> dict:
        path = Path(path)
        return validate_manifest_file(path / "manifest.json" if path.is_dir() else path)

    return check


@pytest.fixture(scope="module")
def tf():
    """TensorFlow, imported before anything in the module converts a tfrecord split (the ``tfrecord`` package's
    protobuf classes clash with TensorFlow's: shardkit only imports it in worker processes)."""
    assert "tfrecord" not in sys.modules, "an earlier test imported the tfrecord package into this process"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow

    return tensorflow


@pytest.fixture()
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test and unmounted after (a disk that really fills; needs root: skipped
    elsewhere)."""
    import subprocess

    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
