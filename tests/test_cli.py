"""The command line: exit codes, one-line errors, config files, environment variables, JSON logs, verify."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit
from shardkit.cli import main
from tests.camvid_copy import small_camvid


def run(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


def test_demo_then_convert_exercises_colour_labels(tmp_path: Path, validate_manifest) -> None:
    assert run("demo", tmp_path / "raw", "--train", "4", "--val", "2").exit_code == 0
    res = run("convert", tmp_path / "raw", tmp_path / "out", "--format", "lmdb", "--size", "96x128", "--quiet")
    assert res.exit_code == 0, res.output
    m = validate_manifest(tmp_path / "out" / "train")
    assert m["source"]["label_kind"] == "colour" and m["classes"]["source"] == "class_dict.csv"
    ds = shardkit.open(tmp_path / "out" / "train")
    assert len(ds) == 4 and ds[0][0].shape == (96, 128, 3)
    assert len(np.unique(np.concatenate([ds[i][1].ravel() for i in range(4)]))) > 3


def test_dry_run_lists_pairs_and_classes(camvid_root: Path, tmp_path: Path) -> None:
    res = run("convert", camvid_root, tmp_path / "out", "--dry-run")
    assert res.exit_code == 0
    assert "train: 123" in res.output.replace("split ", "").replace(" pairs", "") or "123" in res.output
    assert "Bicyclist" in res.output and "ignore index 11" in res.output
    assert not (tmp_path / "out").exists()


def test_unknown_colour_exits_1_with_one_line(rgb_masks_root: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["convert", str(rgb_masks_root), str(tmp_path / "o"), "--split", "val", "-q"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and "255,255,255" in lines[0]
    assert "Traceback" not in res.output


def test_bad_option_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["convert", str(tmp_path), str(tmp_path / "o"), "--size", "big"])
    assert res.exit_code == 2
    res = CliRunner().invoke(main, ["convert", str(tmp_path), str(tmp_path / "o"), "--resize", "exact"])
    assert res.exit_code == 2 and "--size" in res.output


def test_skipped_inputs_exit_3(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=4)
    bad = sorted((raw / "val").iterdir())[1]
    bad.write_bytes(b"")
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--on-error", "skip", "-q"])
    assert res.exit_code == 3
    assert len(shardkit.open(tmp_path / "out" / "val")) == 3


def test_config_file_sets_options_and_flags_win(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=4)
    cfg = tmp_path / "convert.toml"
    cfg.write_text('format = "lmdb"\nsize = "352x480"\nshard-size = 2\nworkers = 1\n')
    assert run("convert", raw, tmp_path / "a", "--config", cfg, "-q").exit_code == 0
    a = shardkit.open(tmp_path / "a" / "val").manifest
    assert a.format == "lmdb" and len(a.shards) == 2 and a.sample["image"]["shape"] == [352, 480, 3]
    assert run("convert", raw, tmp_path / "b", "--config", cfg, "--format", "npy", "-q").exit_code == 0
    assert shardkit.open(tmp_path / "b" / "val").manifest.format == "npy"


def test_config_file_with_unknown_key_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('formatt = "npy"\n')
    res = CliRunner().invoke(main, ["convert", str(tmp_path), str(tmp_path / "o"), "--config", str(cfg)])
    assert res.exit_code == 2 and "formatt" in res.output


def test_environment_variables_set_options(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=4)
    res = run("convert", raw, tmp_path / "o", "-q", env={"SHARDKIT_FORMAT": "lmdb", "SHARDKIT_WORKERS": "1"})
    assert res.exit_code == 0
    assert shardkit.open(tmp_path / "o" / "val").manifest.format == "lmdb"


def test_json_log_lines(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=4)
    bad = sorted((raw / "val").iterdir())[0]
    bad.write_bytes(bad.read_bytes()[:100])
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "o"), "--log-format", "json",
                                    "--on-error", "skip", "--shard-size", "2", "--workers", "1"])
    events = [json.loads(line) for line in res.stderr.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds[0] != "summary" and "start" in kinds and kinds[-1] == "summary"
    assert kinds.count("shard_done") >= 2 and "skipped" in kinds
    summary = events[-1]
    assert summary["samples"] == 3 and summary["skipped"] == 1 and summary["samples_per_second"] > 0
    # the next command in the same process starts afresh: its error is click's plain line, not JSON
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "missing")])
    assert res.exit_code != 0 and not res.output.lstrip().startswith("{")
    bad_manifest = tmp_path / "o" / "val" / "manifest.json"
    bad_manifest.write_text("{")
    res = CliRunner().invoke(main, ["info", str(tmp_path / "o" / "val")])
    assert res.exit_code == 1 and res.output.startswith("Error:"), res.output


def test_info_names_the_label_type_as_numpy_does(camvid_val_npy: Path) -> None:
    """The label's type is printed by its NumPy name (uint8), not the manifest's dtype string (|u1)."""
    res = CliRunner().invoke(main, ["info", str(camvid_val_npy)])
    assert res.exit_code == 0 and "; label index uint8" in res.output and "|u1" not in res.output


def test_verify_passes_then_reports_a_corrupt_shard(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=4)
    assert run("convert", raw, tmp_path / "o", "--size", "352x480", "-q").exit_code == 0
    res = run("verify", tmp_path / "o")
    assert res.exit_code == 0 and "4 samples" in res.output
    shard = sorted((tmp_path / "o" / "val").glob("labels-*.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "o")])
    assert res.exit_code == 1 and "sha256" in res.output and shard.name in res.output


def test_verify_detects_wrong_class_counts(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=4)
    assert run("convert", raw, tmp_path / "o", "-q").exit_code == 0
    path = tmp_path / "o" / "val" / "manifest.json"
    m = json.loads(path.read_text())
    m["stats"]["class_pixels"][0] += 1
    path.write_text(json.dumps(m))
    res = CliRunner().invoke(main, ["verify", str(tmp_path / "o" / "val")])
    assert res.exit_code == 1 and "class pixel counts" in res.output


@pytest.mark.parametrize("cmd", ["info", "verify"])
def test_commands_on_a_folder_without_manifest_fail_cleanly(cmd: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, [cmd, str(tmp_path)])
    assert res.exit_code == 1 and "Traceback" not in res.output and "manifest" in res.output


def bench_rows(report: Path) -> dict[str, float]:
    """Row name → samples/s, from the machine-readable report ``--json`` writes (not the printed table)."""
    return {r["name"]: float(r["samples_per_s"]) for r in json.loads(report.read_text())}


def test_bench_times_the_reader_beside_the_naive_pipeline_on_moved_raw_data(camvid_root: Path,
                                                                            tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=6)
    assert run("convert", raw, tmp_path / "out", "--size", "96x128", "-q").exit_code == 0
    moved = raw.rename(tmp_path / "moved")  # the manifest's source root no longer exists
    res = run("bench", tmp_path / "out" / "val", "--samples", "64", "--repeats", "1", "--workers", "")
    assert res.exit_code == 1 and "--against RAW_DIR" in res.output and len(res.output.strip().splitlines()) == 1
    res = run("bench", tmp_path / "out" / "val", "--against", moved, "--samples", "64", "--repeats", "1",
              "--workers", "", "--json", tmp_path / "bench.json")
    assert res.exit_code == 0, res.output
    rows = bench_rows(tmp_path / "bench.json")
    assert "naive online: decode + crop (uint8, ids)" in rows and "shardkit npy batched, shuffled" in rows
    assert all(rate > 0 for rate in rows.values())  # every row measured a rate
    assert all(name in res.output for name in rows)  # and the printed table shows each of them
    res = run("bench", tmp_path / "out" / "val", "--no-against", "--samples", "32", "--repeats", "1", "--workers", "",
              "--json", tmp_path / "bench2.json")
    assert res.exit_code == 0 and not any(name.startswith("naive") for name in bench_rows(tmp_path / "bench2.json"))


def test_bench_cold_rows_are_measured_in_fresh_processes_and_compared_with_cold_limits(camvid_root: Path,
                                                                                     tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=6)
    assert run("convert", raw, tmp_path / "out", "--size", "96x128", "-q").exit_code == 0
    res = run("bench", tmp_path / "out" / "val", "--cold", "--samples", "32", "--repeats", "1", "--workers", "",
              "--json", tmp_path / "bench.json")
    assert res.exit_code == 0, res.output
    rates = bench_rows(tmp_path / "bench.json")
    assert all(rate > 0 for name, rate in rates.items() if name.startswith("cold: "))
    rows = {}  # the printed table's ratio columns, which only the table shows
    for line in res.output.splitlines()[1:]:
        name, _, rest = line.partition("  ")
        rows[name.strip()] = rest.split()
    cold = {name: v for name, v in rows.items() if name.startswith("cold: ")}
    assert set(cold) == {name for name in rates if name.startswith("cold: ")}
    assert set(cold) == {"cold: limit: copy out of mmap'd shards, random", "cold: shardkit npy batched, sequential",
                         "cold: shardkit npy batched, shuffled", "cold: naive online: decode + crop (uint8, ids)"}
    # cold rows: "× naive u8" and "% mmap" against the cold naive and cold limit rows (each 1 and 100 % of itself)
    assert cold["cold: naive online: decode + crop (uint8, ids)"][2] == "1"
    assert cold["cold: limit: copy out of mmap'd shards, random"][-1] == "100%"
    assert "shardkit npy batched, shuffled" in rates  # the warm rows are still there


def test_bench_rejects_a_bad_worker_list(tmp_path: Path, camvid_root: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=2)
    assert run("convert", raw, tmp_path / "out", "--size", "96x128", "-q").exit_code == 0
    res = run("bench", tmp_path / "out" / "val", "--workers", "two")
    assert res.exit_code == 2 and "--workers" in res.output


def test_a_rerun_that_reused_every_shard_says_so_without_a_decode_rate(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=4)
    first = run("convert", raw, tmp_path / "out", "--size", "96x128")
    assert first.exit_code == 0 and "samples/s" in first.output and "none found" not in first.output
    again = run("convert", raw, tmp_path / "out", "--size", "96x128")
    assert again.exit_code == 0, again.output
    last = again.output.strip().splitlines()[-1]
    assert last.startswith("nothing changed:") and "reused unchanged" in last and "samples/s" not in last


def test_errors_are_json_lines_with_log_format_json(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()  # an empty folder: no layout found
    res = CliRunner().invoke(main, ["convert", str(tmp_path / "in"), str(tmp_path / "out"), "--log-format", "json"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    events = [json.loads(line) for line in res.output.strip().splitlines()]  # every line is a JSON object
    assert events[-1]["event"] == "error" and events[-1]["exit_code"] == 1 and events[-1]["message"]


@pytest.mark.parametrize("args", [["--size", "3y4"], ["--shard-size", "1e400"], ["--size", "99999x99999"],
                                  ["--format", "npy", "--image-codec", "zstd"]])
def test_usage_errors_shardkit_finds_are_one_line_exit_2(camvid_root: Path, tmp_path: Path, args: list[str]) -> None:
    res = CliRunner().invoke(main, ["convert", str(camvid_root), str(tmp_path / "o"), *args])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [res.output.strip()] and res.output.startswith("Error:"), res.output


def _dry_run_splits(output: str) -> list[str]:
    """The split names a --dry-run report lists ('split val: 26 pairs')."""
    return [ln.split()[1].rstrip(":") for ln in output.splitlines() if ln.startswith("split ")]


def test_config_keys_are_the_flag_names(camvid_root: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    for text in ('split = ["val"]\n', 'split = "val"\n', '[convert]\nsplits = ["val"]\n',
                 'split = ["val"]\ncolor-tolerance = 3\nshard_size = "64"\n'):
        cfg.write_text(text)
        res = run("convert", camvid_root, tmp_path / "o", "--dry-run", "--config", cfg)
        assert res.exit_code == 0, (text, res.output)
        assert _dry_run_splits(res.output) == ["val"], (text, res.output)
    cfg.write_text('splitt = ["val"]\n')
    res = CliRunner().invoke(main, ["convert", str(camvid_root), str(tmp_path / "o"), "--dry-run", "--config",
                                    str(cfg)])
    assert res.exit_code == 2 and "'splitt'" in res.output and "did you mean 'split'" in res.output


def test_every_convert_flag_is_a_config_key_and_an_environment_variable() -> None:
    from shardkit.cli import config_keys, convert

    keys = config_keys(convert)
    for param in convert.params:
        if param.name == "config":
            continue
        for opt in getattr(param, "opts", []):
            if opt.startswith("--"):
                key = opt[2:]
                assert keys[key] is param, opt
                assert f"SHARDKIT_{key.upper().replace('-', '_')}" in param.envvar, (opt, param.envvar)
    assert keys["input"].name == "input_dir" and keys["output"].name == "output_dir"


def test_environment_variables_take_the_flag_names(camvid_root: Path, tmp_path: Path) -> None:
    res = run("convert", camvid_root, tmp_path / "o", "--dry-run", env={"SHARDKIT_SPLIT": "val"})
    assert res.exit_code == 0 and _dry_run_splits(res.output) == ["val"], res.output
    res = run("convert", camvid_root, tmp_path / "o", "--dry-run", env={"SHARDKIT_SPLIT": "train val"})
    assert _dry_run_splits(res.output) == ["train", "val"], res.output
    cfg = tmp_path / "c.toml"
    cfg.write_text('split = ["train"]\n')  # the environment wins over the file, flags over both
    res = run("convert", camvid_root, tmp_path / "o", "--dry-run", "--config", cfg, env={"SHARDKIT_SPLIT": "val"})
    assert _dry_run_splits(res.output) == ["val"], res.output
    res = run("convert", camvid_root, tmp_path / "o", "--dry-run", "--split", "train", env={"SHARDKIT_SPLIT": "val"})
    assert _dry_run_splits(res.output) == ["train"], res.output


def test_unknown_shardkit_environment_variable_warns(camvid_root: Path, tmp_path: Path) -> None:
    res = run("convert", camvid_root, tmp_path / "o", "--dry-run",
              env={"SHARDKIT_SPLTI": "val", "SHARDKIT_NO_NUMBA": "1"})
    assert res.exit_code == 0
    lines = [ln for ln in res.stderr.splitlines() if "is not a shardkit setting" in ln]
    assert len(lines) == 1 and "SHARDKIT_SPLTI" in lines[0] and "did you mean SHARDKIT_SPLIT?" in lines[0]
    assert _dry_run_splits(res.output) == ["train", "val"]  # ignored, as it says


def test_library_environment_variables_are_known_to_the_warning() -> None:
    """Every SHARDKIT_* name the package reads is either a flag's or listed in LIBRARY_ENV (no false warning)."""
    import re

    from shardkit.cli import LIBRARY_ENV, config_keys, convert, env_name

    known = LIBRARY_ENV | {env_name(k) for k in config_keys(convert)}
    root = Path(shardkit.__file__).parent
    read = {m for f in root.rglob("*.py") for m in re.findall(r"SHARDKIT_[A-Z0-9_]*[A-Z0-9]", f.read_text())}
    assert read and read <= known, sorted(read - known)


def test_everything_skipped_exits_1(camvid_root: Path, tmp_path: Path) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=2)
    for f in (raw / "val").iterdir():
        f.write_bytes(b"")
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "out"), "--on-error", "skip", "-q",
                                    "--workers", "1"])
    assert res.exit_code == 1, res.output
    assert "every input was skipped (2)" in res.output


def test_closed_stdout_ends_quietly_with_exit_0(camvid_val_npy: Path) -> None:
    """`shardkit info out | head -1`: the reader is gone before shardkit writes; exit 0, nothing on stderr."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # as `head` does once it has its line
    env = {**os.environ, "PYTHONPATH": str(Path(shardkit.__file__).parent.parent)}
    try:
        proc = subprocess.run([sys.executable, "-m", "shardkit", "info", str(camvid_val_npy)], stdout=write_end,
                              stderr=subprocess.PIPE, env=env, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""


def test_object_storage_messages_name_the_bucket_and_the_url(camvid_root: Path, tmp_path: Path) -> None:
    """A missing bucket is named as one (not 'creating the lock object: no such object'); a convert to a bucket
    reports the manifest's URL, not the local staging folder it was written in first."""
    from shardkit.testing import local_s3, make_bucket

    with local_s3():
        make_bucket("out")
        args = ["--split", "val", "--size", "90x120", "--resize", "exact", "--workers", "1"]
        res = CliRunner().invoke(main, ["convert", str(camvid_root), "s3://nobucket/x", *args])
        assert res.exit_code == 1
        error = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
        assert error == [error[0]] and error[0].startswith("Error: s3://nobucket: the bucket does not exist")
        assert "no such object" not in res.output and "create the bucket 'nobucket'" in error[0]
        res = CliRunner().invoke(main, ["convert", str(camvid_root), "s3://out/x", *args])
        assert res.exit_code == 0, res.output
    assert "val: 26 samples in 1 shards → s3://out/x/val/manifest.json" in res.output
    assert "/tmp" not in res.output and tempfile_dir() not in res.output


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


HEAVY = ("h5py", "lmdb", "torch", "tensorflow", "cv2", "numba")


def _modules_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running ``code`` (this checkout first on the path)."""
    import os
    import subprocess
    import sys

    root = Path(shardkit.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_the_cli_imports_no_format_framework_or_decoder() -> None:
    loaded = _modules_after("import shardkit.cli")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    assert "numpy" not in loaded  # --version and --help need none of it


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["info", "--help"]])
def test_version_and_help_import_no_format_framework_or_decoder(args: list[str]) -> None:
    loaded = _modules_after(f"from shardkit.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_convert_options_are_generated_from_their_one_declaration() -> None:
    """Every ConvertConfig field declared with config.option() is a convert option with the field's default,
    listed under its group in --help; nothing else is (but the CLI's own --config, -v and --log-format)."""
    import re

    from shardkit.cli import convert
    from shardkit.conversion.config import GROUPS, ConvertConfig, cli_options

    params = {p.name: p for p in convert.params}
    declared = cli_options()
    assert {spec.param or f.name for f, spec in declared} == set(params) - {
        "config", "input_dir", "output_dir", "verbose", "log_format"}
    defaults = ConvertConfig(Path("in"), Path("out"))
    for f, spec in declared:
        param = params[spec.param or f.name]
        assert getattr(param, "group", None) == spec.group, f.name
        value = getattr(defaults, f.name)
        if isinstance(f.default, str):  # as declared (the config may normalise it: --bands "" → ())
            value = f.default
        if spec.multiple:
            assert param.multiple and not value, f.name  # nothing given: the field's empty value
        elif value is not None:
            assert param.default == (value if isinstance(value, (bool, int, str)) else str(value)), f.name
    text = CliRunner().invoke(main, ["convert", "--help"], terminal_width=200).output
    headings = [f"{title} options:" for title in GROUPS.values()]
    assert [text.index(h) for h in headings] == sorted(text.index(h) for h in headings)
    common_at = text.index("Common options:")
    assert common_at < min(text.index(h) for h in headings)
    for f, spec in declared:  # each flag shows under its own group's heading, or first among the common ones
        flags = spec.flags or ("--" + f.name.replace("_", "-"),)
        found = re.search(rf"(?:^ +|, ){re.escape(flags[-1])}[ ,/\n]", text, re.M)
        assert found, flags
        at = found.start()
        group_at = common_at if set(flags) & set(convert.common) else text.index(f"{GROUPS[spec.group]} options:")
        assert group_at < at and all(not group_at < text.index(h) < at for h in headings), flags


def test_a_declared_choice_is_checked_by_the_config_too() -> None:
    from shardkit.conversion.config import ConvertConfig
    from shardkit.errors import ConfigError

    with pytest.raises(ConfigError, match="backend='yarn' is not one of local, dask"):
        ConvertConfig(Path("in"), Path("out"), backend="yarn")
    res = run("convert", "in", "out", "--backend", "yarn")
    assert res.exit_code == 2 and "'yarn' is not one of 'local', 'dask'" in res.output


# ------------------------------------------------------------------ class files and value maps, end to end
def _camvid_class_files(tmp_path: Path) -> dict[str, Path]:
    """CamVid's 12 classes written as users write them: shuffled id-keyed JSON (a model config's id2label),
    objects with string ids, a one-column CSV with a header."""
    from shardkit.labels import CAMVID_SEGNET

    names = CAMVID_SEGNET.names()
    order = [7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 6, 4]
    files = {"config.json": json.dumps({"model_type": "segformer", "id2label": {str(i): names[i] for i in order}}),
             "objects.json": json.dumps([{"id": str(i), "name": names[i]} for i in order]),
             "classes.csv": "name\n" + "".join(f"{n}\n" for n in names)}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return {name: tmp_path / name for name in files}


def test_convert_keeps_the_class_file_as_written(camvid_root: Path, tmp_path: Path) -> None:
    from PIL import Image

    from shardkit.labels import CAMVID_SEGNET

    raw = small_camvid(camvid_root, tmp_path / "raw", n=1)
    for name, path in _camvid_class_files(tmp_path).items():
        out = tmp_path / f"out-{name}"
        res = run("convert", raw, out, "--classes", path, "--workers", "1", "-q")
        assert res.exit_code == 0, res.output
        m = json.loads((out / "val" / "manifest.json").read_text())
        assert [(c["id"], c["name"]) for c in m["classes"]["classes"]] == list(enumerate(CAMVID_SEGNET.names()))
        label = shardkit.open(out / "val")[0][1]
        with Image.open(next((raw / "valannot").iterdir())) as im:
            assert np.array_equal(label, np.array(im)), name


@pytest.mark.parametrize(("name", "text", "match"), [
    ("sparse.json", '{"0": "Sky", "10": "Bicyclist", "2": "Pole"}', "class ids 0, 2, 10 skip"),
    ("float.json", '[{"id": 1.0, "name": "Building"}, {"id": 0, "name": "Sky"}]', "class id 1.0 is not"),
    ("nul.txt", "Sky\nBuil\x00ding\n", "control character"),
    ("colour.txt", "Sky\n1 2 3\nPole\n", "reads as 'r g b name'"),
])
def test_convert_refuses_a_bad_class_file_before_writing(camvid_root: Path, tmp_path: Path, name: str, text: str,
                                                         match: str) -> None:
    raw = small_camvid(camvid_root, tmp_path / "raw", n=1)
    (tmp_path / name).write_text(text)
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "o"), "--classes", str(tmp_path / name),
                                    "-q"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1 and match in lines[0] and "fix:" in lines[0], res.output
    assert not (tmp_path / "o").exists()


def _raw_ids(root: Path, labels: list[np.ndarray]) -> Path:
    from PIL import Image

    for sub in ("images", "masks"):
        (root / sub).mkdir(parents=True)
    for i, label in enumerate(labels):
        Image.fromarray(np.full((*label.shape, 3), 40 * i, np.uint8)).save(root / "images" / f"{i}.png")
        Image.fromarray(label).save(root / "masks" / f"{i}.png")
    return root


def test_reduce_zero_label_never_moves_a_class_onto_the_ignore_id(tmp_path: Path) -> None:
    raw = _raw_ids(tmp_path / "raw", [np.array([[0, 1], [2, 3]], np.uint8)] * 2)
    res = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "o"), "--num-classes", "3",
                                    "--reduce-zero-label", "--workers", "1"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "all" / "manifest.json").read_text())
    assert m["classes"]["ignore_index"] == 255
    line = next(ln for ln in res.output.splitlines() if ln.startswith("class table:"))
    assert line.endswith("ignore id 255"), line  # the log and the manifest name the same ignore id
    assert shardkit.open(tmp_path / "o" / "all")[0][1].tolist() == [[255, 0], [1, 2]]
    zero = CliRunner().invoke(main, ["convert", str(raw), str(tmp_path / "o0"), "--num-classes", "3",
                                     "--reduce-zero-label", "--ignore-index", "0"])
    assert zero.exit_code == 2 and "raw 1 (class 0 'class_0') would become 0 too" in zero.output
    assert "drop --ignore-index 0" in zero.output and not (tmp_path / "o0").exists()
    wide = _raw_ids(tmp_path / "raw16", [np.array([[0, 1], [255, 256]], np.uint16)])
    res = CliRunner().invoke(main, ["convert", str(wide), str(tmp_path / "o16"), "--reduce-zero-label", "-q"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert "0.png: --reduce-zero-label turns raw value 256 (1 px) into 255" in lines[0]
    assert not (tmp_path / "o16" / "all" / "manifest.json").exists()
