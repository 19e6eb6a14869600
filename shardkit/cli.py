"""The ``shardkit`` command: parse options, build a frozen config, call the library, map errors to exit codes.

``convert``'s options are generated from their one declaration, the fields of
:class:`~shardkit.conversion.config.ConvertConfig` (see :mod:`shardkit.conversion.config` for how to add one), grouped
in ``--help``
under geometry, labels, output and run. Importing this module imports no format, codec, layout or numpy:
choices and help that come from them are looked up when a command needs them, so ``shardkit --version`` and
``--help`` start fast.

Exit codes: 0 success; 1 failed (bad input, I/O, a worker died); 2 usage error (bad
options); 3 finished but skipped some inputs (``--on-error skip``; 1 when it skipped every input); 4
identical images found with ``--on-duplicate error`` (no manifest written); 5 published, but a file written
after the publish (fingerprint cache, no-op signature) was not (a full disk: the version is complete; 3 wins
when both apply); 130 interrupted; a closed stdout (``| head``) ends a command quietly with 0.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ._version import __version__
from .conversion.config import GROUPS, ConvertConfig, OptionSpec, cli_options
from .errors import ConfigError, DuplicateError, ShardkitError
from .support.logs import JsonFormatter
from .support.logs import setup as setup_logging

if TYPE_CHECKING:
    from .conversion.pipeline import ConvertSummary

EXIT_SKIPPED = 3  # converted, but --on-error skip left some inputs out (docs/runs.md: exit codes)
EXIT_DUPLICATES = 4  # --on-duplicate error found identical images; no manifest was written
EXIT_PUBLISHED_WITH_WARNING = 5  # published, but a file written after the publish was not (docs/runs.md: exit codes)
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


_DEFERRED = "shardkit.deferred_choices"


class _LazyChoice(click.Choice):
    """A ``click.Choice`` whose values are looked up when first needed (the formats and layouts behind them
    import numpy, h5py, lmdb, OpenCV …, which no other command should pay for at start-up).

    Within a command the look-up waits for :func:`_check_deferred`: ``convert`` calls it after its unchanged-run
    check, which can only succeed for options a successful run of the same code took (they are in its key), so an
    unchanged run with any options imports none of it; any other run checks them before it does anything else."""

    def __init__(self, values: Callable[[], Sequence[str]], default: str | None = None) -> None:
        self._values = values
        self._found: tuple[str, ...] | None = None
        self._default = default
        super().__init__((), case_sensitive=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is not None and value == self._default:  # the declared default: valid without a look-up
            return value  # (--compression's values come from every format: h5py, lmdb … for a plain run)
        if ctx is not None and param is not None and self._found is None:
            ctx.meta.setdefault(_DEFERRED, []).append((self, param, value))  # looked up by _check_deferred
            return value
        return self.check(value, param, ctx)

    def check(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """``value`` if it is one of the choices; else click's usage error (exit 2), naming the option."""
        if value not in self.choices:
            self.fail(f"{value!r} is not one of {', '.join(self.choices)}", param, ctx)
        return value

    @property
    def choices(self) -> Sequence[str]:
        if self._found is None:
            self._found = tuple(self._values())
        return self._found

    @choices.setter
    def choices(self, _value: Sequence[str]) -> None:  # click.Choice.__init__ assigns the (empty) tuple
        pass


def _check_deferred(ctx: click.Context) -> None:
    """Check the values :class:`_LazyChoice` left for later (each choice list imports what it names)."""
    for choice, param, value in ctx.meta.pop(_DEFERRED, []):
        choice.check(value, param, ctx)


class _GroupedOption(click.Option):
    """An option with a help group (a key of :data:`~shardkit.conversion.config.GROUPS`) and, optionally, a help text
    built only when ``--help`` asks for it."""

    def __init__(self, *args: Any, group: str | None = None, lazy_help: Callable[[], str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group
        self.lazy_help = lazy_help

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        if self.help is None and self.lazy_help is not None:
            self.help = self.lazy_help()
        return super().get_help_record(ctx)


class _GroupedCommand(click.Command):
    """``--help`` lists the ``common`` options first, in that order, then every other option under its group's
    heading (geometry, labels, output, run): each option once."""

    def __init__(self, *args: Any, common: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.common = common

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str | None, list[tuple[str, str]]] = {g: [] for g in GROUPS}
        sections[None] = []
        first: dict[int, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            rank = next((self.common.index(o) for o in param.opts if o in self.common), None)
            if record is not None and rank is not None:
                first[rank] = record
            elif record is not None:
                group = getattr(param, "group", None)
                sections[group if group in GROUPS else None].append(record)
        if first:
            with formatter.section("Common options"):
                formatter.write_dl([first[k] for k in sorted(first)])
        for group, rows in sections.items():
            if rows:
                with formatter.section(f"{GROUPS[group]} options" if group else "Other options"):
                    formatter.write_dl(rows)


def _declared_option(f: Field[Any], spec: OptionSpec) -> Callable[[F], F]:
    """The click option of one declared :class:`~shardkit.conversion.config.ConvertConfig` field."""
    flags = list(spec.flags or ("--" + f.name.replace("_", "-"),))
    default = f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
    kwargs: dict[str, Any] = {"metavar": spec.metavar, "multiple": spec.multiple, "show_default": True}
    if spec.off_flag:
        flags = [f"{flags[-1]}/{spec.off_flag}"]
    elif isinstance(default, bool):
        kwargs["is_flag"] = True
    if spec.choices is not None:
        kwargs["type"] = (_LazyChoice(spec.choices, default if isinstance(default, str) else None)
                          if callable(spec.choices) else click.Choice(spec.choices))
    elif spec.range is not None:
        kwargs["type"] = click.IntRange(*spec.range)
    elif spec.file:
        kwargs["type"] = click.Path(path_type=Path, dir_okay=False, exists=True)
    if default is not None and not spec.multiple:  # (a repeatable option's default is click's: none given)
        kwargs["default"] = default if isinstance(default, (bool, int, str)) else str(default)  # ShardSize → "500"
    help_text = None if callable(spec.help) else spec.help
    lazy = spec.help if callable(spec.help) else None
    return click.option(*flags, spec.param or f.name, cls=_GroupedOption, group=spec.group, help=help_text,
                        lazy_help=lazy, **kwargs)


def _declared_options(fn: F) -> F:
    """Every declared convert option (:func:`shardkit.conversion.config.cli_options`), in declaration order."""
    for f, spec in reversed(cli_options()):
        fn = _declared_option(f, spec)(fn)
    return fn


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
    from .support.tomlcompat import load_small_toml

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


@main.command(cls=_GroupedCommand, context_settings={"auto_envvar_prefix": "SHARDKIT", "show_default": True},
              common=("--format", "--size", "--dry-run", "--split", "--classes", "--workers", "--config"))
@click.option("--config", type=click.Path(path_type=Path, dir_okay=False, exists=True), is_eager=True,
              expose_value=False, callback=_load_config, cls=_GroupedOption, group="run",
              help="TOML file with the same keys as these flags (flags, then SHARDKIT_* variables, win).")
@click.argument("input_dir", type=click.Path(path_type=Path, file_okay=False), envvar="SHARDKIT_INPUT")
@click.argument("output_dir", type=click.Path(path_type=Path), envvar="SHARDKIT_OUTPUT")
@_declared_options  # every ConvertConfig field declared with config.option(): shardkit/conversion/config.py
@click.option("-v", "--verbose", is_flag=True, cls=_GroupedOption, group="run", help="Debug logging.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", cls=_GroupedOption, group="run",
              help="json: one JSON object per line on stderr (start, shard_done, skipped, summary).")
@_errors_to_exit_codes
def convert(input_dir: Path, output_dir: Path, verbose: bool, log_format: str, **options: Any) -> None:
    """Convert the dataset in INPUT_DIR into shards in OUTPUT_DIR/<split>/ with a manifest.json each.

    Either may be an fsspec URL (s3://bucket/prefix, gs://…): see docs/object-storage.md.

    \b
    Examples:
      shardkit convert raw/ out/ --dry-run                    # what was found, which classes; writes nothing
      shardkit convert raw/ out/ --format lmdb --size 352x480 # one folder per split: out/train, out/val
      shardkit convert raw/ out/ --classes classes.json       # names (and ids, colours) as you give them
      shardkit convert raw/ out/ --config convert.toml        # the same flags kept in a file
    Guides: docs/convert.md, docs/layouts.md, docs/runs.md (exit codes).
    """
    setup_logging(quiet=options["quiet"], verbose=verbose, json_lines=log_format == "json")
    from .conversion import unchanged

    # nothing changed since the last successful run: said so without importing the converter (unchanged.py)
    check = unchanged.check_for(input_dir, output_dir, {**options, "verbose": verbose, "log_format": log_format})
    if check is not None and check.unchanged():
        return
    _check_deferred(click.get_current_context())
    from .conversion.pipeline import convert as run

    cfg = ConvertConfig(input_dir, output_dir,
                        **{f.name: options[spec.param or f.name] for f, spec in cli_options()})
    with unchanged.recording(check) as recorder:

        def signed(summary: ConvertSummary) -> None:
            """The no-op signature of a run that succeeded, written while it still holds the output lock: written
            after the lock, it could pair these options with what a run that took the lock meanwhile wrote."""
            if check is not None and not summary.failed and not summary.warnings:  # a cache not written: no signature
                dupes = summary.duplicates
                check.save(summary.manifests, {"samples": summary.samples, "shards": summary.shards,
                                               "bytes": summary.bytes, "skipped": len(summary.skipped),
                                               "duplicates": dupes.extra_copies if dupes is not None else 0},
                           dupes.line() if dupes is not None else "", recorder.lines)

        summary = run(cfg, published=signed)
    if cfg.dry_run:
        for line in summary.discovery.report_lines():
            click.echo(line)
        t = summary.table
        click.echo(f"classes: {t.num_classes} from {summary.table_reason or t.source}, ignore index {t.ignore_index}")
        if cfg.value_map.active:
            click.echo(f"label values: {cfg.value_map.describe()}")
        for c in t.classes:
            click.echo(f"  {c.id:>3} {c.name}" + (f"  rgb{tuple(c.colour)}" if c.colour else ""))
    failed = summary.failed  # duplicates left out as asked are no failure
    if failed and not summary.samples:
        _fail(f"every input was skipped ({len(failed)}): nothing was converted — fix: see the reasons "
              "above (and the manifest's 'skipped' list), then re-run")
    if failed:
        sys.exit(EXIT_SKIPPED)
    if summary.warnings:  # each was logged: the file not written and the version published
        sys.exit(EXIT_PUBLISHED_WITH_WARNING)


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
    from .files.storage import is_url, normalize_url

    if is_url(value):
        return normalize_url(value)
    if not Path(value).exists():
        raise click.BadParameter(f"{value!r} does not exist", param=param)
    return Path(value)


def _weight_methods() -> tuple[str, ...]:
    from .store.stats import WEIGHT_METHODS  # numpy: only for info

    return tuple(WEIGHT_METHODS)


_STORAGE_OPTION = click.option(
    "--storage-option", "storage_option", multiple=True, metavar="KEY=VALUE",
    help="fsspec option for an s3:// (or other fsspec) URL, e.g. endpoint_url=http://host:9000 (repeatable).")


@main.command()
@click.argument("split_dir", callback=_location)
@click.option("--plot", "plot", type=click.Path(path_type=Path, dir_okay=False), metavar="PNG",
              help="Also draw the class pixel-share chart to this PNG file.")
@click.option("--class-weights", "weights", type=_LazyChoice(lambda: _weight_methods()), metavar="METHOD",
              cls=_GroupedOption, lazy_help=lambda: "Print per-class loss weights instead: "
              + ", ".join(_weight_methods()) + " (docs/class-imbalance.md; from the manifest and sidecars, no label "
              "is read).")
@click.option("--enet-k", type=click.FloatRange(1.0, min_open=True), default=1.02, show_default=True,
              help="With --class-weights enet: k in 1 / ln(k + p).")
@click.option("--duplicates", is_flag=True,
              help="List identical images (same decoded pixels) within and across the splits under SPLIT_DIR.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: with --class-weights or --duplicates, those; else each split's annotation report.")
@_STORAGE_OPTION
@_errors_to_exit_codes
def info(split_dir: str | Path, plot: Path | None, weights: str | None, enet_k: float, duplicates: bool,
         as_json: bool, storage_option: tuple[str, ...]) -> None:
    """Summarise a converted split (or every split of an output folder): samples, shards, size, classes.

    SPLIT_DIR may be a URL (s3://bucket/out/train); only its manifest (and, for --class-weights and
    --duplicates, its samples sidecars) is read.
    """
    from .files.storage import is_url, parse_storage_options
    from .verify import split_locations

    options = parse_storage_options(storage_option)
    folders = split_locations(split_dir, options)
    if plot is not None and is_url(split_dir):
        raise click.UsageError("--plot needs a local split folder", ctx=None)
    if not folders:
        raise click.ClickException(f"{split_dir}: no manifest.json here or in its sub-folders — "
                                   "fix: point at a split or output folder written by shardkit convert")
    if as_json and not (weights or duplicates):  # the annotation sources' rasterisation reports
        import json

        from .verify import load_split_manifest

        found = {Path(str(f)).name: load_split_manifest(f, options).source.extra.get("annotations") for f in folders}
        if not any(found.values()):
            raise click.UsageError("--json goes with --class-weights, --duplicates, or a split converted from "
                                   "annotations (its rasterisation report)", ctx=None)
        click.echo(json.dumps(found, indent=1))
        return
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


def _info_weights(folder: str | Path, method: str, k: float, options: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """Print (or return, for --json) one split's class weights with the counts they come from."""
    from .store.source import open_bytes
    from .store.stats import class_weights, split_frequencies, weight_table

    with open_bytes(folder, storage_options=options, lease=False) as source:  # a URL's sidecars alone downloaded
        m = source.manifest
        freqs = split_frequencies(m)
    w = class_weights(method, freqs, k=k)
    names = {c.id: c.name for c in m.classes.classes}
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

    from .store.duplicates import find_duplicates, group_lines, split_hashes
    from .store.source import open_bytes

    shards = []
    with contextlib.ExitStack() as stack:
        for folder in folders:
            m = stack.enter_context(open_bytes(folder, storage_options=options, lease=False)).manifest
            shards += split_hashes(m, m.split)
        report = find_duplicates(shards)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    if report.unchecked and not report.samples:
        click.echo(f"{len(report.unchecked)} shard(s) have no pixel hashes (written by an older shardkit); "
                   "re-run convert with --force to compute them")
        return
    click.echo(report.line())
    for line in group_lines(report):
        click.echo(f"  {line}")
    if report.groups:  # the hashes are the sidecars'; verify recomputes them from the pixels
        click.echo("(from the pixel hashes the samples sidecars keep: shardkit verify recomputes them)")


def _codec_name(codec: Any) -> str:
    """A manifest's codec object as the CLI spells it (``zstd``, ``jpeg:95``)."""
    from .codecs.registry import codec_from_json

    try:
        return str(codec_from_json(codec))
    except ValueError:
        return repr(codec)


def _ignore_line(m: Any) -> str:
    """``ignore index 11 (Unlabelled): 3.21 % of label pixels`` — what a loss must be told to ignore."""
    from .store.stats import ignore_share

    ignore = m.classes.ignore_index
    if ignore is None:
        return "ignore index: none (every label pixel is a class)"
    num = m.classes.num_classes
    name = next((f" ({c.name})" for c in m.classes.classes if c.id == ignore), " (no class)")
    share = ignore_share(m, ignore, num)
    where = f": {100 * share:.2f} % of label pixels" if share is not None else ""
    return f"ignore index {ignore}{name}{where}"


def _info_split(split_dir: str | Path, plot: Path | None, options: dict[str, Any]) -> None:
    from .verify import load_split_manifest

    m = load_split_manifest(split_dir, options)
    nbytes = sum(f.bytes for s in m.shards for f in s.all_files)
    spec = m.sample
    shape = spec.image_dims
    codecs = m.format_options.get("codecs") if m.format_version >= 2 else None
    coded = f" (images {_codec_name(codecs['image'])}, labels {_codec_name(codecs['label'])})" if codecs else ""
    click.echo(f"{split_dir}: split {m.split}, format {m.format} v{m.format_version}{coded}, {m.num_samples} samples, "
               f"{len(m.shards)} shards, {nbytes / 1e6:.1f} MB")
    from .images.imagetypes import NAME_OF

    kind = "" if spec.channel_kind == "RGB" else f" ({shape[-1]} band{'s' * (shape[-1] != 1)})"
    if len(shape) == 4:  # 3-D samples (volume patches): D x H x W, then the bands
        kind = f" (3-D patches D x H x W){kind}"
    extent = "x".join(str(v or "var") for v in shape[:-1])
    label_dtype = spec.stored_label_dtype.str
    click.echo(f"image {extent}x{shape[-1]} {NAME_OF.get(spec.image_dtype, '?')}"
               f"{kind}; label {spec.label_encoding} {NAME_OF.get(label_dtype, label_dtype)}")
    stats = m.stats
    if "image_min" in stats.extra:  # version 4: each band's range, mean and std of the stored values
        nonfinite = stats.extra.get("image_nonfinite") or [0] * len(stats.extra["image_min"])
        for b, (lo, hi, mu, sd, bad) in enumerate(zip(stats.extra["image_min"], stats.extra["image_max"],
                                                      stats.image_mean or (), stats.image_std or (), nonfinite,
                                                      strict=False), start=1):
            extra = f" ({bad} NaN/inf left out)" if bad else ""
            click.echo(f"  band {b:>2}: {lo:g}..{hi:g}, mean {mu:g}, std {sd:g}{extra}" if lo is not None
                       else f"  band {b:>2}: no values{extra}")
    share = stats.class_share or ()
    source = m.classes.source or "an unrecorded source"
    click.echo(f"class table: {m.classes.num_classes} classes from {source}")
    for c in m.classes.classes:
        s = share[c.id] if c.id < len(share) else 0.0
        click.echo(f"  {c.id:>3} {c.name:<20} {100 * s:6.2f} %")
    click.echo(_ignore_line(m))
    from .labels.raster import report_lines

    for line in report_lines(m.source.extra.get("annotations")):
        click.echo(line)
    from .audit.groups import GroupRule, recorded_rule

    rule = recorded_rule(m) or GroupRule()
    try:
        keys, groups = rule.sample_groups(m)
    except ShardkitError as exc:  # a sidecar this reader refuses: said, and info goes on
        click.echo(f"groups: not counted ({' '.join(str(exc).split())[:200]})")
    else:
        sizes = sorted(collections.Counter(groups).values())
        each = "" if not sizes else f", {sizes[0]} each" if sizes[0] == sizes[-1] else f", {sizes[0]}..{sizes[-1]} each"
        click.echo(f"groups: {len(sizes)} of {len(keys)} samples{each}: {rule.describe()} (other rules: shardkit "
                   "split --group-by REGEX)")
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
                                                "types other than uint8 are stretched per band (2-98 percentiles). A "
                                                "volume split: N is the modality drawn (default 1).")
@_STORAGE_OPTION
@_errors_to_exit_codes
def show(split_dir: str | Path, index: int, output: Path | None, alpha: float, augment: str | None, draws: int,
         seed: int, epoch: int, bands: str | None, storage_option: tuple[str, ...]) -> None:
    """Draw one sample of a converted split: image, label in class colours, overlay and a legend.

    With --augment: one row per draw, row k the sample as augmented in epoch EPOCH+k. SPLIT_DIR may be a URL
    (s3://bucket/out/train): the sample's shard is read through the local shard cache.
    """
    from .files.storage import parse_storage_options
    from .show import show_augmented, show_sample

    options = parse_storage_options(storage_option)
    try:
        if augment is not None:
            written = show_augmented(split_dir, index, output or Path(f"sample-{index}-augmented.png"), augment,
                                     draws=draws, seed=seed, epoch=epoch, alpha=alpha, storage_options=options)
        else:
            from .images.imagetypes import parse_bands

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
    """Check every shard under PATH (an output folder or one split): sizes, sha256, decoding, and what the
    sidecars and manifest derive from the samples (class bitmaps, pixel hashes, class counts, statistics).

    PATH may be a URL (s3://bucket/out): shards are then downloaded one at a time to a temporary folder.
    Exit 0 only when everything agrees with the manifests; 1 otherwise, with one line per disagreement
    (at most 10 per column, then a count).
    """
    from .files.storage import parse_storage_options
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


@main.command("split")
@click.argument("path", callback=_location)
@click.option("--into", "into", metavar="PART=SHARE,...",
              help="The parts to make and their shares of the samples, e.g. train=0.8,val=0.1,test=0.1.")
@click.option("--group-by", "group_by", metavar="REGEX",
              help="A sample's group is this pattern's first group in its key (e.g. '(\\w+?)_' for CamVid's "
                   "sequence); default: each sample its own group, tiles of one source together.")
@click.option("--groups", "groups_file", type=click.Path(path_type=Path, dir_okay=False), metavar="CSV",
              help="A CSV of key,group rows naming every sample's group (instead of --group-by).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the order groups are dealt in.")
@click.option("--lists", "lists", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Write <part>.txt (sample keys, one a line: what convert --split-list takes) and "
                   "split-report.json here; without it, only the report is printed.")
@click.option("--check", is_flag=True, help="Only check PATH's existing splits: exit 1 when a group is in more "
                                            "than one of them, or near-duplicates lie in two splits and two groups.")
@click.option("--near", "near", type=click.IntRange(0, 16), default=4, show_default=True, metavar="BITS",
              help="Near-duplicates: samples whose look hashes differ in at most BITS of 64 (a JPEG re-encoding or "
                   "a resize moves 0-2).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_STORAGE_OPTION
@_errors_to_exit_codes
def split_command(path: str | Path, into: str | None, group_by: str | None, groups_file: Path | None, seed: int,
                  lists: Path | None, check: bool, near: int, as_json: bool, storage_option: tuple[str, ...]) -> None:
    """Make train/val/test lists from the converted splits under PATH (pooled) by group, stratified so that every
    class lands in every part where its groups allow (iterative stratification over the class bitmaps; no label
    is read); deterministic for a seed. Re-convert with `shardkit convert RAW OUT --split-list train=DIR/train.txt
    --split-list val=DIR/val.txt ...`. Groups already in two of PATH's splits are reported (with --check: exit 1).
    """
    import json

    from .audit.groups import GroupRule, rule_for
    from .audit.near import KINDS, near_report
    from .audit.split import leaks, plan_split, pool
    from .audit.stratify import parse_ratios
    from .files.storage import parse_storage_options
    from .read.dataset import Dataset
    from .read.options import OpenOptions
    from .verify import split_locations

    if not check and into is None:
        raise click.UsageError("pass --into PART=SHARE,... (or --check to only look for shared groups)")
    options = parse_storage_options(storage_option)
    folders = split_locations(path, options)
    if not folders:
        raise click.ClickException(f"{path}: no manifest.json here or in its sub-folders — "
                                   "fix: point at an output folder written by shardkit convert")
    ratios = parse_ratios(into) if into is not None else {}
    datasets = [Dataset(f, OpenOptions(storage_options=options)) for f in folders]
    rule = rule_for(GroupRule.of(group_by, groups_file), datasets)
    pooled = pool(datasets, rule)
    shared = leaks(pooled)
    said = [f"{len(shared)} group(s) are in more than one split: "
            + "; ".join(f"{g} ({', '.join(s)})" for g, s in list(shared.items())[:5])] if shared else []
    nearby = near_report(pooled.split_of, pooled.groups, pooled.looks, near) if pooled.looks is not None else None
    if nearby is None:
        said.append(f"near-duplicates not searched: {', '.join(pooled.unhashed)} keep no look hashes (converted "
                    "before them; re-convert with --force to add them)")
    else:
        said.append(nearby.line())
        for i, j, bits in nearby.examples[KINDS[0]][:5]:
            said.append(f"  {pooled.keys[i]} ({pooled.splits[int(pooled.split_of[i])]}) ~ {pooled.keys[j]} "
                        f"({pooled.splits[int(pooled.split_of[j])]}): {bits} bits")
    if check:
        click.echo(f"groups: {rule.describe()}; {len(set(pooled.groups))} groups of {len(pooled.keys)} samples in "
                   f"{', '.join(pooled.splits)}")
        for line in said[1 if shared else 0:]:
            click.echo(line)
        problems = []
        if shared:
            problems.append(said[0])
        if nearby is not None and nearby.leaks:
            problems.append(f"{nearby.leaks} near-duplicate pair(s) lie in two splits and two groups")
        if problems:
            raise click.ClickException("; ".join(problems) + " — fix: make new lists with shardkit split --into ... "
                                       "--lists DIR (with a --group-by that puts copies together)")
        click.echo("no group is in more than one split")
        return
    plan = plan_split(pooled, ratios, seed, rule)
    plan.report["shared_groups_before"] = len(shared)
    if nearby is not None:
        plan.report["near_duplicates_before"] = {"threshold": near, **nearby.counts}
    written = plan.write(lists) if lists is not None else []
    if as_json:
        click.echo(json.dumps(plan.report, indent=1))
    else:
        for line in [*plan.lines(), *(f"before: {s}" for s in said)]:
            click.echo(line)
        for p in written:
            click.echo(f"wrote {p}")


@main.command("audit")
@click.argument("path", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--html", "html_file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Write the report page here  [default: PATH/audit.html, unless only --croissant is given]")
@click.option("--croissant", "croissant_file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Write Croissant 1.1 metadata (JSON-LD) here, and its sample table FILE-stem-samples.csv "
                   "beside it.")
@click.option("--group-by", "group_by", metavar="REGEX",
              help="Groups by this pattern's first group in the key (as shardkit split); default: each sample.")
@click.option("--groups", "groups_file", type=click.Path(path_type=Path, dir_okay=False), metavar="CSV",
              help="A CSV of key,group rows (instead of --group-by).")
@click.option("--samples", type=click.IntRange(0, 64), default=8, show_default=True,
              help="Samples drawn (and their labels read) per split for the picture grid.")
@click.option("--near", "near", type=click.IntRange(0, 16), default=4, show_default=True, metavar="BITS",
              help="Near-duplicates: look hashes within BITS of 64 (a JPEG re-encoding or a resize moves 0-2).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the samples drawn.")
@_errors_to_exit_codes
def audit_command(path: Path, html_file: Path | None, croissant_file: Path | None, group_by: str | None,
                  groups_file: Path | None, samples: int, near: int, seed: int) -> None:
    """Write one self-contained HTML report of the converted splits under PATH (opens from disk: no server, no
    network): class pixel share and images per class, groups and groups shared between splits, exact
    duplicates, label sanity, tiles per source, a sample grid with label overlays and how the labels were made.
    Built from the manifests and sidecars; only the drawn samples are read. --croissant also writes Croissant
    1.1 metadata (docs/audit.md).
    """
    from .audit.croissant import write_croissant
    from .audit.facts import gather
    from .audit.groups import GroupRule, rule_for
    from .audit.page import audit_title, render, write_report
    from .errors import OutputError
    from .read.dataset import Dataset
    from .verify import split_locations

    folders = [Path(f) for f in split_locations(path)]
    if not folders:
        raise click.ClickException(f"{path}: no manifest.json here or in its sub-folders — "
                                   "fix: point at an output folder written by shardkit convert")
    target = html_file if html_file is not None or croissant_file is not None else path / "audit.html"
    for written in (target, croissant_file):
        if written is not None and not written.parent.is_dir():
            raise OutputError("the folder to write into does not exist", path=written.parent,
                              fix="create it first or choose another path")
    datasets = [Dataset(f, labels="ids") for f in folders]
    rule = rule_for(GroupRule.of(group_by, groups_file), datasets)
    if target is not None:
        page = render(gather(datasets, rule, near), datasets, audit_title(path), samples=samples, seed=seed)
        click.echo(f"audit report written to {write_report(target, page)}")
    if croissant_file is not None:
        doc, table = write_croissant([(ds.manifest, f) for ds, f in zip(datasets, folders, strict=True)],
                                     croissant_file, Path(path).resolve().name)
        click.echo(f"Croissant metadata written to {doc} (sample table {table})")


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
    from .files.storage import parse_storage_options
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
