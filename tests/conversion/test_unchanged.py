"""The unchanged-nightly fast path (shardkit/conversion/unchanged.py): taken when nothing changed, by observable effect
(the
converter is not called, its lines are said again), and never when anything the output depends on changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import shardkit
import shardkit.conversion.pipeline
from shardkit.cli import main
from shardkit.conversion import unchanged
from shardkit.conversion.unchanged import SIGNATURE_NAME
from shardkit.errors import OutputError
from shardkit.files.lock import OutputLock
from shardkit.support.smallfile import checksum
from tests.camvid_copy import small_camvid

FAST = "is as the last run left them"


class Spy:
    """Stands in for ``shardkit.conversion.pipeline.convert`` (which the CLI imports when it takes the normal path)."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, cfg: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real(cfg, **kwargs)


@pytest.fixture()
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    s = Spy(shardkit.conversion.pipeline.convert)
    monkeypatch.setattr(shardkit.conversion.pipeline, "convert", s)
    return s


def convert(raw: Path, out: Path, *extra: object, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["convert", str(raw), str(out), "--size", "96x128", "--shard-size", "2",
                                     "--workers", "1", *map(str, extra)], env=env, catch_exceptions=False)


def fast(spy: Spy, raw: Path, out: Path, *extra: object, env: dict[str, str] | None = None) -> bool:
    """Run convert; whether it took the fast path (the converter was not called). Exit 0 either way."""
    before = spy.calls
    res = convert(raw, out, *extra, env=env)
    assert res.exit_code == 0, res.output
    taken = spy.calls == before
    assert (FAST in res.output) == taken, res.output
    return taken


@pytest.fixture()
def converted(camvid_root: Path, tmp_path: Path, spy: Spy) -> tuple[Path, Path]:
    raw, out = small_camvid(camvid_root, tmp_path / "raw", n=3), tmp_path / "out"
    assert not fast(spy, raw, out)
    assert (out / SIGNATURE_NAME).is_file()
    return raw, out


def test_nothing_changed_takes_the_fast_path_and_says_what_a_run_says(converted: tuple[Path, Path],
                                                                       spy: Spy) -> None:
    raw, out = converted
    res = convert(raw, out)
    assert res.exit_code == 0 and spy.calls == 1, res.output
    assert "layout segnet (labels: ids)" in res.output  # what was guessed is said on every run
    assert "class table: 12 classes from the segnet layout" in res.output
    assert f"convert {raw} → {out} as npy" in res.output
    assert "nothing changed: 3 samples in 2 shards reused unchanged" in res.output
    assert fast(spy, raw, out)  # and again


def test_json_log_keeps_its_events(converted: tuple[Path, Path], spy: Spy) -> None:
    raw, out = converted
    assert not fast(spy, raw, out, "--log-format", "json")  # another option: the normal path, then a signature
    res = convert(raw, out, "--log-format", "json")
    assert spy.calls == 2
    events = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "summary" and "start" in kinds and "class_table" in kinds
    summary = events[-1]
    assert (summary["samples"], summary["shards"], summary["reused_shards"], summary["skipped"]) == (3, 2, 2, 0)


def test_any_input_change_takes_the_normal_path(converted: tuple[Path, Path], spy: Spy) -> None:
    raw, out = converted
    image = min((raw / "val").iterdir())
    st = image.stat()
    changes: dict[str, Callable[[], None]] = {
        "mtime": lambda: os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9)),
        # same size and mtime (touch -r): the ctime still moves
        "content": lambda: (image.write_bytes(image.read_bytes()[:-1] + b"\0"),
                            os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))),
        "added": lambda: (raw / "val" / "extra.txt").write_text("notes"),
        "renamed": lambda: (raw / "val" / "extra.txt").rename(raw / "val" / "extra2.txt"),
        "removed": lambda: (raw / "val" / "extra2.txt").unlink(),
        "folder": lambda: (raw / "empty").mkdir(),
    }
    for what, change in changes.items():
        change()
        assert not fast(spy, raw, out), what
        assert fast(spy, raw, out), f"{what}: the next run is fast again"


def test_an_option_or_environment_change_takes_the_normal_path(converted: tuple[Path, Path], spy: Spy,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    raw, out = converted
    assert not fast(spy, raw, out, "--shard-size", "3")
    assert fast(spy, raw, out, "--shard-size", "3")
    assert not fast(spy, raw, out, "--shard-size", "3", env={"SHARDKIT_DECODE_THREADS": "1"})
    assert not fast(spy, raw, out, "--shard-size", "3", env={"SHARDKIT_FORMAT": "npy"})
    assert not fast(spy, raw, out, "--shard-size", "3", "--quiet")


def test_a_file_an_option_names_is_part_of_the_key(tmp_path: Path) -> None:
    classes = tmp_path / "classes.txt"
    classes.write_text("road\nsky\n")
    params = {"classes": classes, "split_list": (f"val={classes}",)}
    key = unchanged.run_key(tmp_path, tmp_path / "o", params)
    assert unchanged.run_key(tmp_path, tmp_path / "o", params) == key
    classes.write_text("road\ncar\n")  # same size
    assert unchanged.run_key(tmp_path, tmp_path / "o", params) != key
    assert unchanged.run_key(tmp_path, tmp_path / "o", {"split_list": (f"val={classes}",)}) != key


def test_a_changed_output_takes_the_normal_path(converted: tuple[Path, Path], spy: Spy) -> None:
    raw, out = converted
    manifest = out / "val" / "manifest.json"
    shard = next(p for p in (out / "val").iterdir() if p.name.startswith("images-"))
    changes: dict[str, Callable[[], None]] = {
        "manifest replaced": lambda: manifest.write_bytes(manifest.read_bytes()),
        "manifest removed": lambda: manifest.unlink(),
        "manifest damaged": lambda: manifest.write_text(manifest.read_text()[:-2]),
        "shard removed": lambda: shard.unlink(),
        "shard touched": lambda: os.utime(shard, ns=(0, 0)),
    }
    for what, change in changes.items():
        change()
        assert not fast(spy, raw, out), what
        assert fast(spy, raw, out), f"{what}: repaired, the next run is fast again"
    assert manifest.is_file() and shard.is_file()


def _signed(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the checksum shardkit would give it: valid but edited content, to test the field checks."""
    body = {k: v for k, v in body.items() if k != "checksum"}
    return {**body, "checksum": checksum(body)}


def test_a_damaged_missing_or_foreign_signature_takes_the_normal_path(converted: tuple[Path, Path],
                                                                       spy: Spy) -> None:
    raw, out = converted
    sig = out / SIGNATURE_NAME
    good = json.loads(sig.read_text())
    changes: dict[str, Callable[[], None]] = {
        "damaged": lambda: sig.write_text(sig.read_text()[:100]),
        "removed": lambda: sig.unlink(),
        "another layout": lambda: sig.write_text(json.dumps({**good, "format": 0})),
        "another run": lambda: sig.write_text(json.dumps({**good, "key": "0" * 64})),
        "odd lines": lambda: sig.write_text(json.dumps({**good, "lines": [["x"]]})),
        "outside paths": lambda: sig.write_text(json.dumps({**good, "outputs": {"../x": [0, 0, 0, 0]}})),
        "not an object": lambda: sig.write_text("[]"),
    }
    for what, change in changes.items():
        change()
        assert not fast(spy, raw, out), what
        assert fast(spy, raw, out), what
    # a line whose fields would overwrite the log record's own is said without them, not a traceback
    good = json.loads(sig.read_text())
    hostile = [[20, "hello", {"message": "x", "name": "y", "logger": "z"}]]
    sig.write_text(json.dumps(_signed({**good, "lines": hostile})))
    res = convert(raw, out)
    assert res.exit_code == 0 and "hello" in res.output and FAST in res.output, res.output


def test_rehash_force_and_dry_run_always_take_the_normal_path(converted: tuple[Path, Path], spy: Spy) -> None:
    raw, out = converted
    for extra in (["--rehash"], ["--force"], ["--dry-run"]):
        before = spy.calls
        res = convert(raw, out, *extra)
        assert res.exit_code == 0 and spy.calls == before + 1, extra
    assert not (out / SIGNATURE_NAME).exists()  # --force rewrote the output: the signature went first
    assert not fast(spy, raw, out)
    assert fast(spy, raw, out)


def test_a_failed_run_leaves_no_signature(converted: tuple[Path, Path], spy: Spy) -> None:
    raw, out = converted

    def dies(cfg: Any, **kwargs: Any) -> Any:
        raise OutputError("the disk went away", path=out)

    spy.real = dies
    (raw / "val" / "new.txt").write_text("x")  # something changed: the normal path runs, and fails
    res = convert(raw, out)
    assert res.exit_code == 1
    assert not (out / SIGNATURE_NAME).exists()
    (raw / "val" / "new.txt").unlink()  # back as the old signature had it: still the normal path (none is left)
    before = spy.calls
    assert convert(raw, out).exit_code == 1 and spy.calls == before + 1


def test_a_run_that_fails_after_its_signature_leaves_none(converted: tuple[Path, Path], spy: Spy) -> None:
    """The signature is written while the run holds the lock; a failure after it (releasing the lock, logging the
    summary) still leaves no signature."""
    raw, out = converted

    def fails_late(cfg: Any, **kwargs: Any) -> Any:
        real(cfg, **kwargs)
        assert (out / SIGNATURE_NAME).is_file()  # written by ``published``, under the lock
        raise OutputError("the disk went away after the manifests", path=out)

    real = spy.real
    spy.real = fails_late
    (raw / "val" / "new.txt").write_text("x")
    assert convert(raw, out).exit_code == 1
    assert not (out / SIGNATURE_NAME).exists()


def test_the_signature_is_written_before_the_lock_is_released(camvid_root: Path, tmp_path: Path, spy: Spy,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs with different options on one output, interleaved deterministically: run B takes the lock the moment
    run A releases it and converts to the end before A goes on. A's signature must already be written then (under
    its lock), so B's replaces it; written after the lock (as it was), A's would pair A's options with B's output,
    and a rerun of A's options would wrongly find nothing changed."""
    raw, out = small_camvid(camvid_root, tmp_path / "raw", n=3), tmp_path / "out"
    real_exit = OutputLock.__exit__
    seen: list[dict[str, Any] | None] = []

    def released(self: OutputLock, *exc: Any) -> None:
        real_exit(self, *exc)
        if seen:
            return
        path = out / SIGNATURE_NAME
        seen.append(json.loads(path.read_text()) if path.exists() else None)
        res = convert(raw, out, "--size", "64x96")  # run B, different options, between A's lock and A's return
        assert res.exit_code == 0 and FAST not in res.output, res.output

    monkeypatch.setattr(OutputLock, "__exit__", released)
    res = convert(raw, out)  # run A: --size 96x128
    assert res.exit_code == 0, res.output
    assert seen and seen[0] is not None, "no signature when run A released the output lock"
    assert spy.calls == 2
    shapes = {json.loads(m.read_text())["sample"]["image"]["shape"][0] for m in out.glob("*/manifest.json")}
    assert shapes == {64}  # the output is B's
    monkeypatch.setattr(OutputLock, "__exit__", real_exit)
    assert not fast(spy, raw, out)  # A's options: the output is B's, so the normal path runs (and makes it A's)
    assert fast(spy, raw, out)  # now A's signature and A's output


def test_a_run_that_skipped_inputs_leaves_no_signature(camvid_root: Path, tmp_path: Path, spy: Spy) -> None:
    raw, out = small_camvid(camvid_root, tmp_path / "raw", n=3), tmp_path / "out"
    bad = min((raw / "val").iterdir())
    bad.write_bytes(b"not a png")
    for _ in range(2):
        res = convert(raw, out, "--on-error", "skip")
        assert res.exit_code == 3, res.output
    assert spy.calls == 2 and not (out / SIGNATURE_NAME).exists()


def probe(raw: Path, out: Path, *extra: str) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """``shardkit convert`` in a fresh process: the numpy, OpenCV, format and converter modules it loaded, and
    the process (exit code, stderr)."""
    root = Path(shardkit.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    args = ["convert", str(raw), str(out), "--size", "96x128", "--shard-size", "2", "--workers", "1", *extra]
    code = ("import sys\nfrom shardkit.cli import main\n"
            f"try:\n    main({args!r})\n"
            "except SystemExit as e:\n    print('exit', e.code, file=sys.stderr)\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('numpy', 'cv2', 'h5py', 'lmdb', "
            "'shardkit.conversion.pipeline', 'shardkit.formats.', 'shardkit.conversion.layouts.')))))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return res.stdout.split(), res


def test_the_fast_path_imports_no_converter(converted: tuple[Path, Path]) -> None:
    raw, out = converted
    loaded, res = probe(raw, out)
    assert FAST in res.stderr and "exit 0" in res.stderr, res.stderr
    assert loaded == []


@pytest.mark.parametrize("extra", [("--format", "lmdb"),
                                   ("--format", "hdf5", "--compression", "gzip", "--label-encoding", "onehot",
                                    "--layout", "segnet")])
def test_an_unchanged_run_with_any_options_loads_no_numpy_or_format(camvid_root: Path, tmp_path: Path, spy: Spy,
                                                                    extra: tuple[str, ...]) -> None:
    """Options whose choices come from the formats, encodings and layouts (each imports numpy, h5py, OpenCV …)
    are checked after the unchanged-run check (#42): a run that changed nothing imports none of them, a wrong
    value is still refused with exit 2 where a signature lies, and a changed input still converts."""
    raw, out = small_camvid(camvid_root, tmp_path / "raw", n=3), tmp_path / "out"
    assert not fast(spy, raw, out, *extra)
    loaded, res = probe(raw, out, *extra)
    assert FAST in res.stderr and "exit 0" in res.stderr, res.stderr
    assert loaded == []
    for name, bad in (("--format", "lmdbx"), ("--compression", "zip"), ("--label-encoding", "hot"),
                      ("--layout", "segnett")):
        changed = [*extra, name, bad]
        _, res = probe(raw, out, *changed)
        assert "exit 2" in res.stderr and f"Invalid value for '{name}': '{bad}' is not one of" in res.stderr, \
            res.stderr
        assert (out / SIGNATURE_NAME).is_file()  # refused before anything was touched
    label = next((raw / "valannot").iterdir())
    os.utime(label, ns=(label.stat().st_atime_ns, label.stat().st_mtime_ns + 10**9))
    loaded, res = probe(raw, out, *extra)
    assert FAST not in res.stderr and "exit 0" in res.stderr, res.stderr
    assert "numpy" in loaded and "shardkit.conversion.pipeline" in loaded  # the normal path ran


@pytest.mark.timeout(120)
def test_a_hostile_signature_is_dropped_with_a_warning_and_rebuilt(converted: tuple[Path, Path], spy: Spy) -> None:
    """A signature that is a FIFO (no hang), 100,000-deep JSON (no RecursionError at start-up), over its size cap,
    edited into other valid JSON without its checksum (a summary that lies), or with fields of the wrong type or
    range under a matching checksum: the normal path runs with one warning, and its new signature is used."""
    raw, out = converted
    sig = out / SIGNATURE_NAME
    good = json.loads(sig.read_text())
    changes: dict[str, Callable[[], None]] = {
        "fifo": lambda: (sig.unlink(), os.mkfifo(sig)),
        "folder": lambda: (sig.unlink(), sig.mkdir()),
        "deep": lambda: sig.write_text("[" * 100_000 + "]" * 100_000),
        "deep value": lambda: sig.write_text(json.dumps({**good, "lines": 0})[:-1] + ', "x": '
                                             + "[" * 100_000 + "]" * 100_000 + "}"),
        "too large": lambda: sig.write_bytes(b" " * (unchanged.MAX_SIGNATURE_BYTES + 1)),
        "edited summary": lambda: sig.write_text(json.dumps({**good, "summary": {**good["summary"], "samples": 7}})),
        "no checksum": lambda: sig.write_text(json.dumps({k: v for k, v in good.items() if k != "checksum"})),
        "negative count": lambda: sig.write_text(json.dumps(_signed({**good, "summary": {**good["summary"],
                                                                                        "samples": -1}}))),
        "string stat": lambda: sig.write_text(json.dumps(_signed({**good, "outputs": {
            k: [str(v[0]), *v[1:]] for k, v in good["outputs"].items()}}))),
    }
    for what, change in changes.items():
        change()
        res = convert(raw, out)
        # a folder where the new signature goes cannot be replaced: the version is published, the signature is not
        # written, and the run says so (exit 5: published, with a warning)
        code = 5 if what == "folder" else 0
        assert res.exit_code == code and FAST not in res.output and "Traceback" not in res.output, (what, res.output)
        assert f"{sig}: damaged" in res.output and "takes the normal path" in res.output, (what, res.output)
        if sig.is_dir():
            sig.rmdir()
            assert not fast(spy, raw, out), what
        assert fast(spy, raw, out), f"{what}: the signature was rebuilt"
