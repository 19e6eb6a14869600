"""An unchanged nightly at about the cost of a stat walk: ``shardkit convert`` finds out that nothing changed
before it imports numpy, a format or a decoder, and before discovery.

Every local run (not ``--dry-run``, ``--force``, ``--rehash``, Dask or object storage) first walks the input
tree once with ``os.scandir``: every entry's relative path, and every file's (size, mtime_ns, ctime_ns, inode) —
the same four values the fingerprint cache trusts — go into one digest. A run that succeeds (exit 0) then
leaves a *signature* beside its splits, ``OUTPUT/.shardkit-unchanged.json``, written atomically after every
split's manifest and before the run releases the output lock (so no other run can change the output between its
manifests and its signature): that digest (taken before the run read anything), a digest of everything else the output
depends on (the options as parsed, ``SHARDKIT_*`` variables, files the options name and a folder ``--annotations``
names outside the input, the working folder, the
shardkit code and Python that ran), the stat of every published file (each split's ``manifest.json`` with its
sha256, and every file it names), the run's numbers and the lines it logged about what it found and guessed.

The next run compares: when the key, the input digest and every published file's stat are equal, it logs the
stored lines again (the layout and class table it guessed, warnings), says that nothing changed, and exits 0
without importing the converter. Anything else — a missing, unreadable, damaged or older signature included —
takes the normal path, which first removes the signature (so a run that dies leaves none) and writes a new one
when it succeeds. The output lock is held while comparing, as a normal run would hold it.

This module imports nothing heavy: the CLI calls it first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import ShardkitError
from ..files.lock import OutputLock
from ..files.storage import is_url
from ..support.logs import RESERVED_FIELDS, extra_fields
from ..support.smallfile import checksum, read_json, sha256_of

log = logging.getLogger(__name__)

#: The signature file, in the output folder beside the split folders.
SIGNATURE_NAME = ".shardkit-unchanged.json"
#: Its layout; a signature of another layout is ignored (the normal path runs and writes a new one). Layout 2
#: added ``checksum``: the sha256 of the rest of the signature (:func:`shardkit.support.smallfile.checksum`).
SIGNATURE_FORMAT = 2
#: A signature larger than this is not read (the normal path runs).
MAX_SIGNATURE_BYTES = 64 << 20
#: Files the options name are hashed whole up to this size (stat only beyond).
MAX_HASHED_OPTION_FILE = 16 << 20
#: Lines kept for the replay (a run that logs more keeps its first ones; a no-op logs few).
MAX_LINES = 1000
#: Options under which a run always takes the normal path (and leaves no signature).
_NORMAL_ONLY = {"force": True, "rehash": True, "backend": "dask"}


def tree_digest(root: Path) -> str | None:
    """sha256 of every entry under ``root`` (relative path; for files size, mtime_ns, ctime_ns, inode), sorted by
    name within each folder; None where the walk cannot decide (an unreadable folder, a broken link, a link to
    a folder): the normal path then runs and reports what it finds."""
    h = hashlib.sha256()
    stack = [""]
    base = os.fspath(root)
    while stack:
        rel = stack.pop()
        lines: list[str] = []
        add = lines.append
        try:
            with os.scandir(f"{base}/{rel}" if rel else base) as it:
                for e in it:  # per-file Python kept to this loop: it is most of the check's time
                    if e.is_dir(follow_symlinks=False):
                        stack.append(f"{rel}/{e.name}" if rel else e.name)
                        add(e.name + "/")
                    elif e.is_symlink() and e.is_dir():
                        return None
                    else:
                        st = e.stat()  # a link to a file: the file it names
                        add(f"{e.name}\0{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}")
        except OSError:
            return None
        lines.sort()  # the folder's entries by name ("/" and "\0" are in no name)
        h.update(f"{rel}\n".encode("utf-8", "surrogateescape"))
        h.update("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n\n")
    return h.hexdigest()


def _stat(path: str | Path) -> list[int]:
    st = Path(path).stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _named_files(value: Any) -> Iterator[str]:
    """Strings in an option's value that name an existing file (``--classes F``, ``--split-list train=F``,
    ``--label-map F``, a ``KEY=FILE`` storage option, ``--annotations coco:FILE`` …)."""
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _named_files(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _named_files(v)
    elif isinstance(value, (str, Path)):
        text = os.fspath(value)
        for candidate in (text, text.partition("=")[2], text.partition(":")[2]):  # also --annotations coco:FILE
            try:
                named = bool(candidate) and Path(candidate).is_file()
            except (OSError, ValueError):  # a value no path can be (too long, a NUL): no file
                named = False
            if named:
                yield candidate


def _code_stats() -> list[Any]:
    """(path, size, mtime_ns) of every module of the running shardkit: an edited checkout is another program."""
    package = Path(__file__).resolve().parents[1]
    out: list[Any] = [str(package)]
    for path in sorted(package.rglob("*.py")):
        st = path.stat()
        out.append([path.relative_to(package).as_posix(), st.st_size, st.st_mtime_ns])
    return out


def _annotation_folder(input_dir: Path, value: Any) -> list[str] | None:
    """``--annotations SOURCE:FOLDER`` outside the input folder (labelme files kept elsewhere): the folder and its
    :func:`tree_digest`, so that an edited file in it is a change (a named file is hashed by :func:`run_key`)."""
    named = str(value or "").partition(":")[2]
    try:
        if not named or not Path(named).is_dir() or Path(os.path.realpath(named)).is_relative_to(
                os.path.realpath(input_dir)):
            return None
    except (OSError, ValueError):
        return None
    digest = tree_digest(Path(named))
    if digest is None:
        raise ValueError(f"{named}: the walk cannot decide")  # the check is not used: the normal path runs
    return [named, digest]


def run_key(input_dir: Path, output_dir: Path, params: Mapping[str, Any]) -> str:
    """sha256 of everything besides the input tree that a run's output (or what it logs) depends on."""
    files = []
    for path in sorted(set(_named_files(list(params.values())))):
        size = Path(path).stat().st_size
        files.append([path, os.path.realpath(path), *_stat(path),
                      sha256_of(path) if size <= MAX_HASHED_OPTION_FILE else None])
    what = {
        "format": SIGNATURE_FORMAT, "shardkit": __version__, "code": _code_stats(),
        "python": [sys.version, sys.executable], "cwd": str(Path.cwd()),
        "input": [os.fspath(input_dir), os.path.realpath(input_dir)],
        "output": [os.fspath(output_dir), os.path.realpath(output_dir)],
        "params": {k: params[k] for k in sorted(params)}, "files": files,
        "annotations": _annotation_folder(input_dir, params.get("annotations")),
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith("SHARDKIT_")),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


class Check:
    """One run's fast check: the signature it compares with, and what it records when the normal path succeeds."""

    def __init__(self, input_dir: Path, output_dir: Path, params: Mapping[str, Any], *, usable: bool = True) -> None:
        self.started = time.perf_counter()
        self.output = Path(output_dir)
        self.path = self.output / SIGNATURE_NAME
        self.key, self.tree = "", None
        self._warned = False  # a damaged signature is reported once per run
        if usable:
            try:
                self.key = run_key(input_dir, output_dir, params)
                # before the run reads anything: a file changed meanwhile differs next time
                self.tree = tree_digest(Path(input_dir))
            except (OSError, ValueError):  # the check never fails a run: the normal path says what is wrong
                self.tree = None

    def stored(self) -> dict[str, Any] | None:
        """The signature in the output folder, if it is one this run can use; None otherwise. A damaged one (not a
        regular file, too large, not JSON, a field of the wrong type, a checksum that disagrees) is dropped with a
        warning: the normal path runs and writes a new one."""
        try:
            data = read_json(self.path, "signature", limit=MAX_SIGNATURE_BYTES)
            problem = _problem(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            problem = str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
        if problem is not None:
            if not self._warned:
                log.warning("%s: damaged (%s), ignored: this run takes the normal path and writes a new one",
                            self.path, problem)
                self._warned = True
            return None
        if not (data["format"] == SIGNATURE_FORMAT and data["key"] == self.key and self.tree is not None
                and data["tree"] == self.tree):
            return None
        return data

    def unchanged(self) -> bool:
        """Whether nothing changed since the run that left the signature: then its lines are logged again, with
        the summary, and the caller ends the run (exit 0). Under the output lock; a held lock is the normal
        path's to report."""
        if self.tree is None or self.stored() is None:
            return False
        try:
            with OutputLock(self.output):
                data = self.stored()  # again, under the lock
                if data is None or not _published_intact(self.output, data.get("outputs")):
                    return False
                summary = data["summary"]
                lines = [(int(level), str(msg), {str(k): v for k, v in dict(fields).items()
                                                 if k not in RESERVED_FIELDS})  # not the record's own attributes
                         for level, msg, fields in data["lines"]]
                numbers = {k: int(summary[k]) for k in ("samples", "shards", "bytes", "skipped", "duplicates")}
                duplicates = str(summary["duplicates_line"])
        except (ShardkitError, OSError, KeyError, TypeError, ValueError):
            return False
        for level, msg, fields in lines:
            name = str(fields.pop("logger", "shardkit"))
            logging.getLogger(name if name.startswith("shardkit.") else "shardkit").log(level, "%s", msg, extra=fields)
        seconds = time.perf_counter() - self.started
        log.info("nothing changed: %d samples in %d shards reused unchanged, %.1f MB; every input file, option "
                 "and published file is as the last run left them (checked in %.2f s)%s", numbers["samples"],
                 numbers["shards"], numbers["bytes"] / 1e6, seconds, f"; {duplicates}" if duplicates else "",
                 extra={"event": "summary", "reused_shards": numbers["shards"], "seconds": round(seconds, 3),
                        "samples_per_second": 0.0, "unchanged": True, **numbers})
        return True

    def forget(self) -> None:
        """Remove the signature: the normal path is about to change the output (a run that dies leaves none)."""
        with contextlib.suppress(OSError):  # can't: a signature left stale still names the old manifests' stat
            self.path.unlink()

    def save(self, manifests: list[Path | str], numbers: Mapping[str, int], duplicates_line: str,
             lines: list[tuple[int, str, dict[str, Any]]]) -> None:
        """Write the signature after a successful run that published ``manifests`` (local paths); an OSError
        writing it (a full disk) is raised, for the run to report as a warning after its publish."""
        from ..store.manifest import MAX_MANIFEST_BYTES, named_files  # the converter is loaded by now; the fast path
        from ..store.publish import atomic_write_bytes
        from ..support.smallfile import loads_bounded, read_guarded  # never imports these

        if self.tree is None:
            return
        outputs: dict[str, list[Any]] = {}
        try:
            for manifest in manifests:
                path = Path(manifest)
                rel = path.parent.relative_to(self.output).as_posix()
                raw = read_guarded(path, "manifest", limit=MAX_MANIFEST_BYTES)
                outputs[f"{rel}/{path.name}"] = [*_stat(path), hashlib.sha256(raw).hexdigest()]
                for name in sorted(named_files(loads_bounded(raw, "manifest"))):
                    outputs[f"{rel}/{name}"] = _stat(path.parent / name)
            body = {"format": SIGNATURE_FORMAT, "shardkit": __version__, "key": self.key, "tree": self.tree,
                    "outputs": outputs, "summary": {**numbers, "duplicates_line": duplicates_line},
                    "lines": [list(line) for line in lines[:MAX_LINES]]}
            body = json.loads(json.dumps(body, default=str))  # as it will be read back (tuples as lists, …)
            body["checksum"] = checksum(body)
            atomic_write_bytes(self.path, json.dumps(body).encode())
        except ValueError as exc:  # the conversion itself succeeded: only the next fast check is lost
            log.warning("%s: not written (%s); the next run takes the normal path", self.path, exc)


_NUMBERS = ("samples", "shards", "bytes", "skipped", "duplicates")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _problem(data: Any) -> str | None:
    """What is wrong with a parsed signature (None: every field has its type and range, and the checksum
    agrees). Only a signature of this layout is checked field by field; another layout is simply not used."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("format") != SIGNATURE_FORMAT:
        return None if _is_int(data.get("format")) else "no format number"
    body = {k: v for k, v in data.items() if k != "checksum"}
    if data.get("checksum") != checksum(body):
        return "its checksum does not match its content"
    for key in ("key", "tree"):
        if not isinstance(data.get(key), str):
            return f"{key} is not a string"
    outputs, summary, lines = data.get("outputs"), data.get("summary"), data.get("lines")
    if not isinstance(outputs, dict) or not all(
            isinstance(rel, str) and isinstance(want, list) and len(want) in (4, 5)
            and all(_is_int(v) and v >= 0 for v in want[:4]) and all(isinstance(v, str) for v in want[4:])
            for rel, want in outputs.items()):
        return "outputs is not a map of file to stat"
    if not isinstance(summary, dict) or not all(_is_int(summary.get(k)) and summary[k] >= 0 for k in _NUMBERS) \
            or not isinstance(summary.get("duplicates_line"), str):
        return "summary is not the run's counts"
    if not isinstance(lines, list) or len(lines) > MAX_LINES or not all(
            isinstance(line, list) and len(line) == 3 and _is_int(line[0]) and 0 <= line[0] <= 50
            and isinstance(line[1], str) and isinstance(line[2], dict) for line in lines):
        return "lines is not a list of log lines"
    return None


def _published_intact(output: Path, outputs: Any) -> bool:
    """Whether every published file is as recorded: same stat (and each manifest the same sha256)."""
    if not isinstance(outputs, dict) or not outputs:
        return False
    for rel, want in outputs.items():
        if not isinstance(rel, str) or not isinstance(want, list) or rel.startswith("/") or ".." in rel.split("/"):
            return False
        path = output / rel
        try:
            if _stat(path) != want[:4]:
                return False
            if len(want) > 4 and sha256_of(path) != want[4]:
                return False
        except OSError:
            return False
    return True


def check_for(input_dir: Path, output_dir: Path, params: Mapping[str, Any]) -> Check | None:
    """The fast check of a ``shardkit convert`` with these parsed options; None for a dry run or an output on
    object storage. A run the fast path does not apply to (see the module notes) gets a check that is never
    unchanged and saves nothing, but still forgets the signature before the run writes."""
    if is_url(output_dir) or params.get("dry_run"):
        return None
    usable = not (is_url(input_dir) or params.get("storage_option")
                  or any(params.get(name) == value for name, value in _NORMAL_ONLY.items()))
    return Check(input_dir, output_dir, params, usable=usable)


class Recorder(logging.Handler):
    """Keeps what a normal run logs about what it found and guessed, for the signature: every line up to and
    including the ``start`` event, and every warning after it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str, dict[str, Any]]] = []
        self._started = False

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.INFO or (self._started and record.levelno < logging.WARNING):
            return
        fields = {k: v for k, v in extra_fields(record).items()
                  if isinstance(v, (str, int, float, bool, type(None), list))}
        self.lines.append((record.levelno, record.getMessage(), {**fields, "logger": record.name}))
        self._started = self._started or fields.get("event") == "start"


@contextlib.contextmanager
def recording(check: Check | None) -> Iterator[Recorder]:
    """Around a normal run: forget the old signature first, and record the run's lines (see :class:`Recorder`).
    The run writes its signature (:meth:`Check.save`) while it still holds the output lock; should it fail after
    that, the signature is forgotten again."""
    recorder = Recorder()
    if check is None:
        yield recorder
        return
    check.forget()
    logger = logging.getLogger("shardkit")
    logger.addHandler(recorder)
    try:
        yield recorder
    except BaseException:
        check.forget()
        raise
    finally:
        logger.removeHandler(recorder)
