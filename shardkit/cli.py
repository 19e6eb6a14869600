"""The ``shardkit`` command: parse options, build a frozen config, call the library, map errors to exit codes.

Exit codes: 0 success; 1 failed (bad input, I/O, a worker died); 2 usage error (bad
options); 3 finished but skipped some inputs (``--on-error skip``; 1 when it skipped every input); 4
identical images found with ``--on-duplicate error`` (no manifest written); 130 interrupted; a closed
stdout (``| head``) ends a command quietly with 0.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from . import encoding
from ._version import __version__
from .config import DEFAULT_MAX_PIXELS, ConvertConfig, ShardSize, parse_size, parse_split_lists
from .duplicates import ON_DUPLICATE
from .errors import ConfigError, DuplicateError, ShardkitError
from .formats.registry import all_formats
from .formats.registry import names as format_names
from .logs import JsonFormatter
from .logs import setup as setup_logging
from .publish import DEFAULT_KEEP_VERSIONS
from .stats import WEIGHT_METHODS

EXIT_SKIPPED = 3  # converted, but --on-error skip left some inputs out (README: exit codes)
EXIT_DUPLICATES = 4  # --on-duplicate error found identical images; no manifest was written
F = TypeVar("F", bound=Callable[..., Any])


class _UsageLine(click.ClickException):
    """A usage error shardkit found in the options: exit 2 and one ``Error:`` line, without click's usage block
    (click's own parsing errors keep theirs)."""

    exit_code = 2


def _fail(message: str, code: int = 1) -> NoReturn:
    """Exit ``code`` with one line: a JSON ``error`` event when ``--log-format json`` is active, else click's."""
    handlers = logging.getLogger("shardkit").handlers
    if any(isinstance(h.formatter, JsonFormatter) for h in handlers):
        logging.getLogger("shardkit").error(message, extra={"event": "error", "exit_code": code})
        sys.exit(code)
    exc = click.ClickException(message)
    exc.exit_code = code
    raise exc from None


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (``shardkit info out | head -1`` after ``head`` exits)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's buffer)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _quiet_exit_after_closed_stdout() -> NoReturn:
    """The reader of our output stopped reading, as ``head`` does: that is not an error, so exit 0 in silence.

    stdout is pointed at /dev/null first, so that the interpreter's last flush cannot fail again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(0)


def _errors_to_exit_codes(fn: F) -> F:
    """ShardkitError (and any other OSError) → one line on stderr and exit 1 (2 for ConfigError); no tracebacks.

    A closed stdout (the output piped into ``head``) ends the command quietly with exit 0."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            raise _UsageLine(str(exc)) from None
        except DuplicateError as exc:
            _fail(str(exc), EXIT_DUPLICATES)
        except ShardkitError as exc:
            _fail(str(exc))
        except BrokenPipeError:
            if not _stdout_closed():  # a pipe to a worker or a server: a real failure
                raise
            _quiet_exit_after_closed_stdout()
        except OSError as exc:  # an I/O error no layer below named: still one line, exit 1
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc} — fix: check the path, its permissions and the free disk space, "
                  "then re-run")
        except KeyboardInterrupt:
            click.echo("interrupted; nothing half-written is visible, re-run to finish", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardkit")
def main() -> None:
    """Convert segmentation datasets once into training-ready shards, and inspect them."""
    # Every command starts from plain warnings on stderr (convert and demo then choose their own);
    # nothing of a previous command in the same process (e.g. its JSON format) carries over.
    setup_logging(quiet=True)


def _compressions() -> list[str]:
    """Every ``--compression`` value some format takes (the format then checks its own)."""
    return list(dict.fromkeys(c for fmt in all_formats() for c in fmt.compressions))


def _takes(fact: str) -> str:
    """Which format takes which values of one option, from the formats' own facts: 'lmdb: raw, zstd; …'."""
    parts = [f"{fmt.name}: {', '.join(v for v in getattr(fmt, fact) if v not in ('none', 'raw'))}"
             for fmt in all_formats() if len(getattr(fmt, fact)) > 1]
    return "; ".join(parts) or "none"


def _size(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    try:
        return parse_size(value)
    except ConfigError as exc:
        raise _UsageLine(str(exc)) from None


def _shard_size(_ctx: click.Context, _param: click.Parameter, value: str) -> ShardSize:
    try:
        return ShardSize.parse(value)
    except ConfigError as exc:
        raise _UsageLine(str(exc)) from None


class _LayoutName(click.ParamType):
    """``--layout``: auto or a registered layout's name, looked up only when the option is used (importing the
    layouts, and the label decoders they bring, would slow every other command's start)."""

    name = "layout"

    @staticmethod
    def _names() -> list[str]:
        from .layouts.registry import names

        return ["auto", *names(auto_only=True)]

    def get_metavar(self, param: click.Parameter, *args: Any, **kwargs: Any) -> str:
        return "[" + "|".join(self._names()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value not in self._names():
            self.fail(f"{value!r} is not one of {', '.join(self._names())}", param, ctx)
        return str(value)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"client_kwargs": {"region_name": "x"}} → {"client_kwargs.region_name": "x"} (--storage-option keys)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


ENV_PREFIX = "SHARDKIT_"
# SHARDKIT_* variables the library itself reads (not options): no warning for these.
# tests/test_cli.py checks that every SHARDKIT_ name the package's code reads is listed here.
LIBRARY_ENV = frozenset({"SHARDKIT_CACHE_DIR", "SHARDKIT_CACHE_LIMIT", "SHARDKIT_DECODE_THREADS",
                         "SHARDKIT_LOCK_TTL", "SHARDKIT_NO_NUMBA", "SHARDKIT_READ_THROUGH", "SHARDKIT_STAGING_DIR",
                         "SHARDKIT_STORAGE_OPTIONS", "SHARDKIT_TEST_DATA", "SHARDKIT_CONFIG"})
# a [convert.storage_options] table, as docs/object-storage.md has always shown it, is --storage-option
_TABLE_ALIASES = {"storage-options": "storage-option", "split-lists": "split-list"}


def config_keys(command: click.Command) -> dict[str, click.Parameter]:
    """Every key a ``--config`` file (and, upper-cased, a ``SHARDKIT_*`` variable) may use, from the command's own
    parameter declarations: each long flag without its dashes (``split``, ``shard-size``, ``colour-tolerance``
    and ``color-tolerance``), the parameter's Python name (``splits``), and for an argument the name its
    ``envvar`` declares (``SHARDKIT_INPUT`` → ``input``). ``_`` and ``-`` are the same in a key."""
    keys: dict[str, click.Parameter] = {}
    for param in command.params:
        if not param.name or param.name == "config":
            continue
        if isinstance(param, click.Option):
            names = [o.lstrip("-") for o in param.opts if o.startswith("--")] + [param.name]
        else:
            declared = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
            names = [e[len(ENV_PREFIX):] for e in declared if e.startswith(ENV_PREFIX)] or [param.name]
        for name in names:
            keys.setdefault(name.lower().replace("_", "-"), param)
    return keys


def env_name(key: str) -> str:
    """``shard-size`` → ``SHARDKIT_SHARD_SIZE``."""
    return ENV_PREFIX + key.upper().replace("-", "_")


def bind_env_names(command: click.Command) -> None:
    """Let every option of ``command`` be set by ``SHARDKIT_<FLAG>`` for each of its config keys
    (``SHARDKIT_SPLIT=val``, ``SHARDKIT_SHARD_SIZE=64``), the same names a ``--config`` file takes; a repeatable
    option takes several values separated by spaces (``SHARDKIT_SPLIT="train val"``)."""
    by_param: dict[str, list[str]] = {}
    for key, param in config_keys(command).items():
        by_param.setdefault(str(param.name), []).append(env_name(key))
    for param in command.params:
        if param.name in by_param:
            param.envvar = by_param[param.name]


def _warn_unknown_env(command: click.Command) -> None:
    """A ``SHARDKIT_*`` variable that names no option and no library setting is a typo: say so (it is ignored)."""
    import difflib
    import os

    known = {env_name(k) for k in config_keys(command)} | LIBRARY_ENV
    for name in sorted(n for n in os.environ if n.startswith(ENV_PREFIX) and n not in known):
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        logging.getLogger("shardkit").warning(
            "%s is not a shardkit setting and is ignored — %sthe options are SHARDKIT_<FLAG>, e.g. "
            "SHARDKIT_FORMAT, SHARDKIT_SPLIT, SHARDKIT_SHARD_SIZE (shardkit convert --help lists the flags)",
            name, hint)


def _config_value(param: click.Parameter, val: Any) -> Any:
    """A TOML value as the option's default: a table of storage options → KEY=VALUE strings; one value of a
    repeatable option → a list of one; a ``size = [352, 480]`` list → ``"352,480"``."""
    import json

    if param.name == "storage_option" and isinstance(val, dict):  # a [convert.storage_options] table
        return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in _flatten(val).items()]
    if param.name == "split_list" and isinstance(val, dict):  # split_list = {train = "lists/train.txt"}
        return [f"{k}={v}" for k, v in val.items()]
    if getattr(param, "multiple", False) and not isinstance(val, list):
        return [val]
    if param.name == "size" and isinstance(val, list):
        return ",".join(map(str, val))
    return val


def _load_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """--config FILE.toml: its keys (the flags' names, see :func:`config_keys`) become defaults; SHARDKIT_*
    variables and then flags win. Also warns about SHARDKIT_* variables that name nothing."""
    _warn_unknown_env(ctx.command)
    if value is None:
        return None
    from .tomlcompat import load_small_toml

    try:
        data = load_small_toml(value, "config file")
    except (OSError, ValueError) as exc:  # ValueError: bad TOML (UnicodeDecodeError is one too)
        raise click.BadParameter(f"{value}: cannot read ({exc})", param_hint="--config") from None
    section = data.get("convert", data)
    keys = config_keys(ctx.command)
    defaults: dict[str, Any] = {}
    for key, val in section.items():
        norm = key.lower().replace("_", "-")
        param = keys.get(_TABLE_ALIASES.get(norm, norm) if isinstance(val, dict) else norm)
        if param is None or not param.name:
            import difflib

            close = difflib.get_close_matches(norm, sorted(keys), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise click.BadParameter(f"{value}: unknown key {key!r}{hint}; the keys are the flags' names, "
                                     "e.g. format, size, split, shard-size", param_hint="--config")
        defaults[param.name] = _config_value(param, val)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


@main.command(context_settings={"auto_envvar_prefix": "SHARDKIT", "show_default": True})
@click.option("--config", type=click.Path(path_type=Path, dir_okay=False, exists=True), is_eager=True,
              expose_value=False, callback=_load_config,
              help="TOML file with the same keys as these flags (flags, then SHARDKIT_* variables, win).")
@click.argument("input_dir", type=click.Path(path_type=Path, file_okay=False), envvar="SHARDKIT_INPUT")
@click.argument("output_dir", type=click.Path(path_type=Path), envvar="SHARDKIT_OUTPUT")
@click.option("--format", "format", type=click.Choice(list(format_names())), default="npy",
              show_default=True, help="Shard format.")
@click.option("--size", callback=_size, metavar="HxW", help="Target size, e.g. 352x480 (height x width).")
@click.option("--resize", type=click.Choice(["none", "exact", "shorter"]), default="none", show_default=True,
              help="none: no scaling; exact: scale to --size; shorter: scale keeping aspect so --size is covered.")
@click.option("--crop", type=click.Choice(["center", "none"]), default="center", show_default=True,
              help="center: crop or pad to --size (TF resize_image_with_crop_or_pad); "
                   "none: shape set by --resize only.")
@click.option("--label-encoding", type=click.Choice(encoding.NAMES), default="index",
              show_default=True, help="Stored labels: class ids, one-hot uint8, or bit-packed one-hot.")
# -- layout, pairing and classes (shardkit.layouts, labels/policy.py; docs/layouts.md)
@click.option("--layout", type=_LayoutName(), default="auto", show_default=True,
              help="Input layout (docs/layouts.md); auto tries each in turn.")
@click.option("--images", "images", metavar="TEMPLATE",
              help="Pair explicitly: image paths under INPUT_DIR, e.g. 'img/{split}/{name}.tif' ({split} optional, "
                   "{name} the part image and label share; * ? ** globs). Needs --labels.")
@click.option("--labels", "labels", metavar="TEMPLATE",
              help="Label paths for --images, e.g. 'gt/{split}/{name}_mask.gif'.")
@click.option("--split-list", "split_list", multiple=True, metavar="SPLIT=FILE",
              help="A list file from anywhere for one split (repeatable): 'image label' lines, or one image "
                   "name a line choosing among the pairs found.")
@click.option("--label-suffix", help="Label file name = image stem + this suffix (e.g. _L, _mask).")
@click.option("--classes", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Class list: names, optionally ids and colours (JSON, CSV with a name column, or text lines "
                   "'name', 'id name', 'r g b name').")
@click.option("--class-dict", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="class_dict.csv (name,r,g,b) if not at the input root.")
@click.option("--palette", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Colour table file (CSV, JSON or 'r g b name' lines) for colour masks.")
@click.option("--num-classes", type=click.IntRange(1, 65535),
              help="Number of classes of id labels (names class_0 …); without it, --classes or a table the layout "
                   "identifies, the ids found in the label files are used.")
@click.option("--ignore-index", type=click.IntRange(0, 65535), help="Stored id meaning 'ignore' (e.g. 255).")
@click.option("--colour-tolerance", "--color-tolerance", type=click.IntRange(0, 255), default=0, show_default=True,
              help="Map colours within N per channel to their nearest class colour.")
@click.option("--unknown-as", type=click.IntRange(0, 65535), help="Map unknown colours / out-of-range ids to this id.")
# label values (shardkit.labels.values): at most one of these three
@click.option("--label-map", metavar="SRC:ID,…|FILE",
              help="Map raw label values to class ids, e.g. 255:1,0:0 for 0/255 masks (ranges: 128-255:1), or a "
                   "file of SRC:ID lines / a JSON object; values it does not name are kept.")
@click.option("--reduce-zero-label", is_flag=True,
              help="mmsegmentation's rule (ADE20K, LoveDA): 0 becomes the ignore id (255 unless "
                   "--ignore-index), every other value v becomes v-1.")
@click.option("--threshold", type=click.IntRange(0, 65534), metavar="T",
              help="Binary masks (JPEG ones too): value > T is class 1, else 0 (e.g. --threshold 127); "
                   "refused on labels with more than two classes.")
@click.option("--cityscapes-train-ids/--cityscapes-label-ids", default=True, show_default=True,
              help="Cityscapes: apply the official labelId→trainId mapping.")
@click.option("--split", "splits", multiple=True, help="Only convert this split (repeatable).")
@click.option("--shard-size", callback=_shard_size, default="500", show_default=True,
              help="Samples per shard (500), or, given a byte size such as 256MB, bytes per shard instead.")
@click.option("--compression", type=click.Choice(_compressions()), default="none", show_default=True,
              help="Whole-shard compression: " + _takes("compressions") + ".")
@click.option("--image-codec", default="raw", show_default=True, metavar="CODEC",
              help="Per-image codec (docs/codecs.md): " + _takes("image_codecs") + "; jpeg:Q is lossy (Q 1-100).")
@click.option("--label-codec", default="raw", show_default=True, metavar="CODEC",
              help="Per-label codec, always lossless: " + _takes("label_codecs") + ".")
# -- image type and bands (shardkit.imagetypes; docs/images.md): stored as decoded unless asked
@click.option("--bands", metavar="N,N,…", help="Store only these bands of each image, in this order (1-based), "
                                              "e.g. 4,3,2.")
@click.option("--image-dtype", type=click.Choice(["uint8", "uint16", "int16", "float32"]),
              help="Store images as this type (default: as decoded). Lossless widening needs nothing; anything else "
                   "--rescale.")
@click.option("--rescale", metavar="shift|minmax|percentile:P",
              help="How --image-dtype changes values: shift (drop low bits: uint16 >> 8), minmax or percentile:P "
                   "(per image and band, clipped at the P and 100-P percentiles).")
@click.option("--pages-as-bands", is_flag=True, help="A multi-page TIFF's pages are the bands of one image.")
@click.option("--workers", type=click.IntRange(0), default=0, show_default=True,
              help="Worker processes; 0 = all cores.")
@click.option("--backend", type=click.Choice(["local", "dask"]), default="local", show_default=True,
              help="local: a process pool on this machine; dask: the same shard tasks on a Dask cluster.")
@click.option("--scheduler", metavar="ADDRESS", help="Dask scheduler, e.g. tcp://host:8786 (default: a local cluster).")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="fail: stop at the first bad input; skip: leave it out, list it in the manifest, exit 3.")
@click.option("--on-duplicate", type=click.Choice(list(ON_DUPLICATE)), default="warn", show_default=True,
              help="Identical images (same decoded pixels) within or across splits: warn: list them; error: exit 4 "
                   "before writing a manifest; skip: keep the first copy (split order, then index), drop the rest.")
@click.option("--max-pixels", type=click.IntRange(1), default=DEFAULT_MAX_PIXELS, show_default=True,
              help="Largest image or label (height x width, read from its header before any decoder runs); also "
                   "caps --size. The default, 4096x4096, keeps one worker under ~1 GB (0.5 GB measured at the "
                   "limit); raise it for larger images and expect ~30 bytes per pixel per worker.")
@click.option("--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for s3:// (or any fsspec URL) input/output, e.g. endpoint_url=http://host:9000, "
                   "profile=NAME, anon=true (repeatable; dots nest: client_kwargs.region_name=eu-west-1).")
@click.option("--strict", is_flag=True, help="Images without labels (or labels without images) are an error.")
@click.option("--dry-run", is_flag=True, help="Report what was found; write nothing.")
@click.option("--force", is_flag=True, help="Rebuild every shard, even those an earlier run left intact.")
@click.option("--rehash", is_flag=True,
              help="Trust no file's (size, mtime, ctime, inode): re-hash every source and shard file "
                   "before reusing a shard (reads everything; catches what a stat cannot see, e.g. bit rot).")
@click.option("--keep-versions", type=click.IntRange(1), default=DEFAULT_KEEP_VERSIONS, show_default=True,
              help="Publishes of each split kept (manifest-v<N>.json and their shards) for readers that opened "
                   "them; older ones are removed unless a live reader holds a lease on them.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, warnings and errors only.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              help="json: one JSON object per line on stderr (start, shard_done, skipped, summary).")
@_errors_to_exit_codes
def convert(input_dir: Path, output_dir: Path, format: str, size: tuple[int, int] | None, resize: str, crop: str,
            label_encoding: str, layout: str, images: str | None, labels: str | None,
            split_list: tuple[str, ...], label_suffix: str | None, classes: Path | None, class_dict: Path | None,
            palette: Path | None, num_classes: int | None, ignore_index: int | None, colour_tolerance: int,
            unknown_as: int | None, label_map: str | None, reduce_zero_label: bool, threshold: int | None,
            cityscapes_train_ids: bool, splits: tuple[str, ...], shard_size: ShardSize,
            compression: str, image_codec: str, label_codec: str, bands: str | None, image_dtype: str | None,
            rescale: str | None, pages_as_bands: bool, workers: int, backend: str, scheduler: str | None,
            on_error: str, on_duplicate: str, max_pixels: int, storage_option: tuple[str, ...],
            strict: bool, dry_run: bool, force: bool, rehash: bool, keep_versions: int, quiet: bool,
            verbose: bool, log_format: str) -> None:
    """Convert the dataset in INPUT_DIR into shards in OUTPUT_DIR/<split>/ with a manifest.json each.

    Either may be an fsspec URL (s3://bucket/prefix, gs://…): see docs/object-storage.md.
    """
    setup_logging(quiet=quiet, verbose=verbose, json_lines=log_format == "json")
    from .imagetypes import parse_bands
    from .pipeline import convert as run
    from .storage import parse_storage_options

    cfg = ConvertConfig(
        input=input_dir, output=output_dir, format=format, size=size, resize=resize, crop=crop,
        label_encoding=label_encoding, layout=layout, images=images, labels=labels,
        split_lists=parse_split_lists(split_list), classes=classes, label_suffix=label_suffix, class_dict=class_dict,
        palette=palette, num_classes=num_classes, ignore_index=ignore_index, colour_tolerance=colour_tolerance,
        unknown_as=unknown_as, label_map=label_map, reduce_zero_label=reduce_zero_label, threshold=threshold,
        cityscapes_train_ids=cityscapes_train_ids, splits=splits, shard_size=shard_size,
        compression=compression, image_codec=image_codec, label_codec=label_codec, workers=workers, backend=backend,
        scheduler=scheduler, on_error=on_error, on_duplicate=on_duplicate,
        strict=strict, dry_run=dry_run, force=force, rehash=rehash, quiet=quiet, max_pixels=max_pixels,
        storage_options=parse_storage_options(storage_option), keep_versions=keep_versions,
        bands=parse_bands(bands), image_dtype=image_dtype, rescale=rescale, pages_as_bands=pages_as_bands,
    )
    summary = run(cfg)
    if dry_run:
        for line in summary.discovery.report_lines():
            click.echo(line)
        t = summary.table
        click.echo(f"classes: {t.num_classes} from {summary.table_reason or t.source}, ignore index {t.ignore_index}")
        if cfg.value_map.active:
            click.echo(f"label values: {cfg.value_map.describe()}")
        for c in t.classes:
            click.echo(f"  {c.id:>3} {c.name}" + (f"  rgb{tuple(c.colour)}" if c.colour else ""))
    failed = [s for s in summary.skipped if "duplicate_of" not in s]  # duplicates left out as asked are no failure
    if failed and not summary.samples:
        _fail(f"every input was skipped ({len(failed)}): nothing was converted — fix: see the reasons "
              "above (and the manifest's 'skipped' list), then re-run")
    if failed:
        sys.exit(EXIT_SKIPPED)


bind_env_names(convert)  # SHARDKIT_<FLAG> for every flag of convert, the names --config takes


@main.command()
@click.argument("output_dir", type=click.Path(path_type=Path), default="demo-raw")
@click.option("--train", type=click.IntRange(1), default=24, show_default=True)
@click.option("--val", type=click.IntRange(0), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@_errors_to_exit_codes
def demo(output_dir: Path, train: int, val: int, seed: int) -> None:
    """Write a small synthetic street-scene dataset (colour masks + class_dict.csv) to OUTPUT_DIR."""
    setup_logging()
    from .demo import make_demo

    root = make_demo(output_dir, train=train, val=val, seed=seed)
    click.echo(f"demo dataset written to {root}", err=True)


def _location(_ctx: click.Context, param: click.Parameter, value: str) -> str | Path:
    """A URL as given (object storage), else a local path that must exist."""
    from .storage import is_url, normalize_url

    if is_url(value):
        return normalize_url(value)
    if not Path(value).exists():
        raise click.BadParameter(f"{value!r} does not exist", param=param)
    return Path(value)


_STORAGE_OPTION = click.option(
    "--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
    help="fsspec option for an s3:// (or other fsspec) URL, e.g. endpoint_url=http://host:9000 (repeatable).")


@main.command()
@click.argument("split_dir", callback=_location)
@click.option("--plot", "plot", type=click.Path(path_type=Path, dir_okay=False), metavar="PNG",
              help="Also draw the class pixel-share chart to this PNG file.")
@click.option("--class-weights", "weights", type=click.Choice(list(WEIGHT_METHODS)), metavar="METHOD",
              help="Print per-class loss weights instead: " + ", ".join(WEIGHT_METHODS)
                   + " (docs/class-imbalance.md; from the manifest and sidecars, no label is read).")
@click.option("--enet-k", type=click.FloatRange(1.0, min_open=True), default=1.02, show_default=True,
              help="With --class-weights enet: k in 1 / ln(k + p).")
@click.option("--duplicates", is_flag=True,
              help="List identical images (same decoded pixels) within and across the splits under SPLIT_DIR.")
@click.option("--json", "as_json", is_flag=True, help="With --class-weights or --duplicates: print JSON.")
@_STORAGE_OPTION
@_errors_to_exit_codes
def info(split_dir: str | Path, plot: Path | None, weights: str | None, enet_k: float, duplicates: bool,
         as_json: bool, storage_option: tuple[str, ...]) -> None:
    """Summarise a converted split (or every split of an output folder): samples, shards, size, classes.

    SPLIT_DIR may be a URL (s3://bucket/out/train); only its manifest (and, for --class-weights and
    --duplicates, its samples sidecars) is read.
    """
    from .storage import is_url, parse_storage_options
    from .verify import split_locations

    options = parse_storage_options(storage_option)
    folders = split_locations(split_dir, options)
    if plot is not None and is_url(split_dir):
        raise click.UsageError("--plot needs a local split folder", ctx=None)
    if as_json and not (weights or duplicates):
        raise click.UsageError("--json goes with --class-weights or --duplicates", ctx=None)
    if not folders:
        raise click.ClickException(f"{split_dir}: no manifest.json here or in its sub-folders — "
                                   "fix: point at a split or output folder written by shardkit convert")
    if duplicates:
        _info_duplicates(folders, options, as_json)
        return
    if weights:
        tables = [_info_weights(folder, weights, enet_k, options, as_json) for folder in folders]
        if as_json:
            import json

            click.echo(json.dumps(tables[0] if len(tables) == 1 else tables, indent=1))
        return
    for folder in folders:
        chart = plot
        if plot is not None and len(folders) > 1:  # one chart per split: chart-train.png, chart-val.png, …
            chart = plot.with_name(f"{plot.stem}-{Path(folder).name}{plot.suffix}")
        _info_split(folder, chart, options)


@contextlib.contextmanager
def _split_records(folder: str | Path, options: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """(manifest, sidecar folder map) of a local split or a split URL (whose sidecars alone are downloaded)."""
    from .samples import remote_sidecars
    from .storage import Remote, is_url
    from .verify import load_split_manifest

    m = load_split_manifest(folder, options)
    if not is_url(folder):
        yield m, None
        return
    with remote_sidecars(Remote(str(folder), options)) as where:
        yield m, where


def _info_weights(folder: str | Path, method: str, k: float, options: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """Print (or return, for --json) one split's class weights with the counts they come from."""
    from .stats import class_weights, split_frequencies, weight_table

    with _split_records(folder, options) as (m, where):
        freqs = split_frequencies(m, where)
    w = class_weights(method, freqs, k=k)
    names = {int(c["id"]): str(c["name"]) for c in m.classes["classes"]}
    rows = weight_table(w.tolist(), freqs, [names.get(c, str(c)) for c in range(freqs.num_classes)])
    if not as_json:
        click.echo(f"{folder}: split {m.split}, {freqs.num_images} samples, class weights {method}"
                   + (f" (k={k})" if method == "enet" else ""))
        click.echo(f"  {'id':>3} {'class':<20} {'weight':>9} {'pixels %':>9} {'images':>7}")
        for r in rows:
            share = "ignore" if r["share"] is None else f"{100 * r['share']:.3f}"
            images = "" if r["images"] is None else str(r["images"])
            click.echo(f"  {r['id']:>3} {r['name']:<20} {r['weight']:>9.4f} {share:>9} {images:>7}")
    return {"location": str(folder), "split": m.split, "method": method, "k": k if method == "enet" else None,
            "weights": w.tolist(), "classes": rows}


def _info_duplicates(folders: list[str | Path], options: dict[str, Any], as_json: bool) -> None:
    """Identical images across ``folders`` (one output's splits), with their keys."""
    import json

    from .duplicates import find_duplicates, split_hashes

    shards = []
    with contextlib.ExitStack() as stack:
        for folder in folders:
            m, where = stack.enter_context(_split_records(folder, options))
            shards += split_hashes(m, m.split, where)
        report = find_duplicates(shards)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    if report.unchecked and not report.samples:
        click.echo(f"{len(report.unchecked)} shard(s) have no pixel hashes (written by an older shardkit); "
                   "re-run convert with --force to compute them")
        return
    click.echo(report.line())
    for g in report.groups:
        click.echo(f"  {'across splits' if g.across_splits else 'within split '}  {g}")


def _codec_name(codec: Any) -> str:
    """A manifest's codec object as the CLI spells it (``zstd``, ``jpeg:95``)."""
    from .codecs import codec_from_json

    try:
        return str(codec_from_json(codec))
    except ValueError:
        return repr(codec)


def _ignore_line(m: Any) -> str:
    """``ignore index 11 (Unlabelled): 3.21 % of label pixels`` — what a loss must be told to ignore."""
    from .stats import ignore_share

    ignore = m.classes.get("ignore_index")
    if ignore is None:
        return "ignore index: none (every label pixel is a class)"
    num = int(m.classes.get("num_classes", len(m.classes["classes"])))
    name = next((f" ({c['name']})" for c in m.classes["classes"] if c["id"] == ignore), " (no class)")
    share = ignore_share(m.stats, ignore, num)
    where = f": {100 * share:.2f} % of label pixels" if share is not None else ""
    return f"ignore index {ignore}{name}{where}"


def _info_split(split_dir: str | Path, plot: Path | None, options: dict[str, Any]) -> None:
    from .verify import load_split_manifest

    m = load_split_manifest(split_dir, options)
    nbytes = sum(f.bytes for s in m.shards for f in s.all_files)
    shape = m.sample["image"]["shape"]
    codecs = m.format_options.get("codecs") if m.format_version >= 2 else None
    coded = f" (images {_codec_name(codecs['image'])}, labels {_codec_name(codecs['label'])})" if codecs else ""
    click.echo(f"{split_dir}: split {m.split}, format {m.format} v{m.format_version}{coded}, {m.num_samples} samples, "
               f"{len(m.shards)} shards, {nbytes / 1e6:.1f} MB")
    from .imagetypes import NAME_OF

    image = m.sample["image"]
    kind = "" if image.get("channels", "RGB") == "RGB" else f" ({shape[2]} band{'s' * (shape[2] != 1)})"
    click.echo(f"image {shape[0] or 'var'}x{shape[1] or 'var'}x{shape[2]} {NAME_OF.get(image.get('dtype'), '?')}"
               f"{kind}; label {m.sample['label']['encoding']} {m.sample['label'].get('dtype')}")
    if "image_min" in m.stats:  # version 4: each band's range, mean and std of the stored values
        for b, (lo, hi, mu, sd) in enumerate(zip(m.stats["image_min"], m.stats["image_max"], m.stats["image_mean"],
                                                 m.stats["image_std"], strict=False), start=1):
            click.echo(f"  band {b:>2}: {lo:g}..{hi:g}, mean {mu:g}, std {sd:g}" if lo is not None
                       else f"  band {b:>2}: no values")
    share = m.stats.get("class_share", [])
    source = m.classes.get("source") or "an unrecorded source"
    click.echo(f"class table: {len(m.classes['classes'])} classes from {source}")
    for c in m.classes["classes"]:
        s = share[c["id"]] if c["id"] < len(share) else 0.0
        click.echo(f"  {c['id']:>3} {c['name']:<20} {100 * s:6.2f} %")
    click.echo(_ignore_line(m))
    if m.skipped:
        click.echo(f"{len(m.skipped)} inputs were skipped (see manifest.json 'skipped')")
    if plot is not None:
        from .show import plot_classes

        click.echo(f"class chart written to {plot_classes(Path(split_dir), plot)}", err=True)


@main.command()
@click.argument("split_dir", callback=_location)
@click.option("--index", "-i", type=int, default=0, show_default=True,
              help="Sample index (negative counts from the end).")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), metavar="PNG",
              help="Picture to write  [default: sample-INDEX.png]")
@click.option("--alpha", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
              help="Label opacity in the overlay.")
@click.option("--augment", metavar="SPEC",
              help="Draw the sample as augmented, e.g. 'scale=0.5:2,crop=352x480,hflip,jitter=0.2': "
                   "one row per draw instead of the legend picture.")
@click.option("--draws", type=click.IntRange(1), default=8, show_default=True,
              help="With --augment: rows, one per epoch (epoch, epoch+1, ...).")
@click.option("--seed", type=int, default=0, show_default=True, help="With --augment: augmentation seed.")
@click.option("--epoch", type=click.IntRange(0), default=0, show_default=True,
              help="With --augment: epoch of the first row.")
@click.option("--bands", metavar="R,G,B|N", help="Bands drawn as red, green, blue (e.g. 4,3,2), or one as gray; "
                                                "types other than uint8 are stretched per band (2-98 percentiles).")
@_STORAGE_OPTION
@_errors_to_exit_codes
def show(split_dir: str | Path, index: int, output: Path | None, alpha: float, augment: str | None, draws: int,
         seed: int, epoch: int, bands: str | None, storage_option: tuple[str, ...]) -> None:
    """Draw one sample of a converted split: image, label in class colours, overlay and a legend.

    With --augment: one row per draw, row k the sample as augmented in epoch EPOCH+k. SPLIT_DIR may be a URL
    (s3://bucket/out/train): the sample's shard is read through the local shard cache.
    """
    from .show import show_augmented, show_sample
    from .storage import parse_storage_options

    options = parse_storage_options(storage_option)
    try:
        if augment is not None:
            written = show_augmented(split_dir, index, output or Path(f"sample-{index}-augmented.png"), augment,
                                     draws=draws, seed=seed, epoch=epoch, alpha=alpha, storage_options=options)
        else:
            from .imagetypes import parse_bands

            written = show_sample(split_dir, index, output or Path(f"sample-{index}.png"), alpha=alpha,
                                  storage_options=options, bands=parse_bands(bands))
    except IndexError as exc:
        raise click.BadParameter(str(exc), param_hint="--index") from None
    click.echo(f"sample {index} written to {written}", err=True)


@main.command()
@click.argument("path", callback=_location)
@_STORAGE_OPTION
@_errors_to_exit_codes
def verify(path: str | Path, storage_option: tuple[str, ...]) -> None:
    """Check every shard under PATH (an output folder or one split): sizes, sha256, decoding, class counts.

    PATH may be a URL (s3://bucket/out): shards are then downloaded one at a time to a temporary folder.
    Exit 0 only when everything agrees with the manifests; 1 otherwise, with a report per shard.
    """
    from .storage import parse_storage_options
    from .verify import split_locations, verify_split

    options = parse_storage_options(storage_option)
    folders = split_locations(path, options)
    if not folders:
        raise click.ClickException(f"{path}: no manifest.json here or in its sub-folders — "
                                   "fix: point at an output folder written by shardkit convert")
    failed = 0
    for folder in folders:
        report = verify_split(folder, options)
        if report.ok:
            click.echo(f"ok      {folder}: {report.samples} samples in {report.shards} shards verified")
        else:
            failed += 1
            click.echo(f"FAILED  {folder}: {len(report.problems)} problem(s)")
            for problem in report.problems:
                click.echo(f"  - {problem}")
    if failed:
        raise click.ClickException(f"{failed} of {len(folders)} split(s) failed verification")


@main.command("diff")
@click.argument("path", callback=_location)
@click.option("--from", "old", type=click.IntRange(1), metavar="V1",
              help="The older version (default: the kept version before --to).")
@click.option("--to", "new", type=click.IntRange(1), metavar="V2", help="The newer version (default: the current).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: every split's added, removed, changed.")
@_STORAGE_OPTION
@_errors_to_exit_codes
def diff(path: str | Path, old: int | None, new: int | None, as_json: bool, storage_option: tuple[str, ...]) -> None:
    """List the samples added, removed and changed (by key and fingerprint) between two kept versions of each
    split under PATH (an output folder or one split; a URL too). Versions are numbered per split."""
    import json

    from .diff import diff_split
    from .storage import parse_storage_options
    from .verify import split_locations

    options = parse_storage_options(storage_option)
    folders = split_locations(path, options)
    if not folders:
        raise click.ClickException(f"{path}: no manifest.json here or in its sub-folders — "
                                   "fix: point at an output folder written by shardkit convert")
    reports = [diff_split(folder, old, new, storage_options=options) for folder in folders]
    if as_json:
        click.echo(json.dumps({"splits": [r.to_json() for r in reports]}, indent=1))
        return
    for report in reports:
        for line in report.lines():
            click.echo(line)


@main.command()
@click.argument("split_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--against", "against", metavar="[RAW_DIR]", is_flag=False, flag_value="", default="",
              help="Also time the naive online pipeline on the source images (the default): in the source "
              "folder the manifest names, or in RAW_DIR when the data has moved.")
@click.option("--no-against", is_flag=True, help="Skip the naive online pipeline.")
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option("--samples", type=click.IntRange(1), default=2048, show_default=True, help="Samples per timed pass.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--workers", default="0,2", show_default=True, help="PyTorch DataLoader worker counts to time.")
@click.option("--cold", is_flag=True, help="Also time reads from a cold page cache: the files are evicted "
              "before each pass, which runs in a fresh process (rows marked 'cold:').")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Also write results here.")
@_errors_to_exit_codes
def bench(split_dir: Path, against: str, no_against: bool, batch_size: int, samples: int, repeats: int,
          workers: str, cold: bool, json_path: Path | None) -> None:
    """Measure read throughput of SPLIT_DIR beside the naive online pipeline, in one run; print ratios."""
    import json
    from dataclasses import asdict

    from .bench import run_bench, table

    setup_logging(quiet=True)
    try:
        counts = tuple(int(w) for w in workers.split(",") if w.strip())
    except ValueError:
        raise click.BadParameter(f"{workers!r} is not a comma-separated list of integers",
                                 param_hint="--workers") from None
    results = run_bench(split_dir, against=not no_against, source=Path(against) if against else None,
                        batch_size=batch_size, samples=samples, repeats=repeats, workers=counts, cold=cold)
    click.echo(table(results))
    if json_path:
        json_path.write_text(json.dumps([asdict(r) for r in results], indent=1))
