"""Object storage through fsspec: URL recognition, storage options, and the few transfers shardkit needs.

Local paths never come here: only a ``scheme://`` URL (``s3://``, ``gs://``, ``memory://`` …) does, and
only then is ``fsspec`` imported (the ``s3`` extra). ``file://`` URLs are turned back into local paths, so
they take the local code path with its guarantees (flock, rename, fsync).

Credentials and endpoint come from the standard environment (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``,
``AWS_ACCESS_KEY_ID`` …, read by botocore itself) or from ``storage_options`` given by the caller
(``--storage-option key=value``, nested keys with dots: ``client_kwargs.region_name=eu-west-1``).
One filesystem object is made per process and URL root (fsspec caches it), so credentials are resolved
once per process, not per shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError, InputNotFoundError, ShardkitError, StorageError
from ..support.extras import install_hint
from ..support.smallfile import loads_bounded

log = logging.getLogger(__name__)

#: ``s3://bucket/x``, ``gs://…``: also as ``s3:/bucket/x``, what ``Path`` makes of it (two or more
#: letters, so a Windows drive ``C:/`` is not a scheme).
URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def extra_hint() -> str:
    """What to install for object storage (worded when needed: the package metadata costs ~40 ms to load)."""
    return "install the object-storage packages: " + install_hint("s3")


#: Largest small object read whole into memory (manifests, records, list files, the lock).
MAX_SMALL_OBJECT = 256 * 1024 * 1024
#: Bytes read at a time by a size-bounded download.
DOWNLOAD_CHUNK = 8 * 1024 * 1024


def is_url(path: str | os.PathLike[str] | None) -> bool:
    """True for ``scheme://…`` (or the ``scheme:/…`` that ``Path`` leaves of it); False for local paths."""
    return path is not None and bool(URL_RE.match(os.fspath(path)))


def normalize_url(path: str | os.PathLike[str]) -> str:
    """``s3:/bucket/x/`` (a URL that went through ``Path``) → ``s3://bucket/x``."""
    text = re.sub(r"^([^:/]+):/(?!/)", r"\1://", os.fspath(path))
    return text.rstrip("/") if not text.endswith("://") else text


def local_path(url: str) -> Path | None:
    """The local path of a ``file://`` URL (which then takes the local code path), else None."""
    text = normalize_url(url)
    if text.startswith(("file://", "local://")):
        return Path(text.split("://", 1)[1] or "/")
    return None


def require_fsspec() -> Any:
    """Import fsspec, or raise a one-line error naming the extra to install."""
    try:
        import fsspec
    except ImportError:
        raise StorageError("object storage URLs need fsspec, which is not installed", fix=extra_hint()) from None
    return fsspec


def _value(text: str) -> Any:
    """``true``/``false``/``null``, numbers and JSON stay typed; anything else is a string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return loads_bounded(text, "value")
    except ValueError:  # not JSON (or nested past any option): a string
        return text


def parse_storage_options(items: Iterable[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``["key=value", "client_kwargs.region_name=x"]`` (or a mapping, e.g. a TOML table) → nested dict."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return {str(k): (parse_storage_options(v) if isinstance(v, Mapping) else v) for k, v in items.items()}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--storage-option {item!r} is not key=value",
                              fix="write it like --storage-option anon=true or client_kwargs.region_name=eu-west-1")
        node = out
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--storage-option {item!r}: {part!r} is both a value and a group")
        node[leaf] = _value(raw.strip())
    return out


def resolve_options(url: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The caller's options, completed from the environment: ``SHARDKIT_STORAGE_OPTIONS`` (JSON) first, then
    for ``s3://`` the endpoint in ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (MinIO, Ceph, moto …)."""
    options: dict[str, Any] = {}
    env = os.environ.get("SHARDKIT_STORAGE_OPTIONS")
    if env:
        try:
            loaded = loads_bounded(env, "SHARDKIT_STORAGE_OPTIONS")
        except ValueError:
            raise ConfigError("SHARDKIT_STORAGE_OPTIONS is not a JSON object",
                              fix='set it like SHARDKIT_STORAGE_OPTIONS=\'{"anon": true}\'') from None
        if not isinstance(loaded, dict):
            raise ConfigError("SHARDKIT_STORAGE_OPTIONS is not a JSON object")
        options.update(loaded)
    options.update(dict(given or {}))
    if normalize_url(url).split("://", 1)[0] in ("s3", "s3a"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kwargs = dict(options.get("client_kwargs") or {})
        if endpoint and "endpoint_url" not in options and "endpoint_url" not in kwargs:
            options["endpoint_url"] = endpoint
        # Resolved here, in the process that was started with them, and carried to the worker processes
        # (a reused worker pool may have been started before the environment was set).
        if not {"key", "secret", "token", "profile", "anon"} & set(options):
            if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
                options["key"] = os.environ["AWS_ACCESS_KEY_ID"]
                options["secret"] = os.environ["AWS_SECRET_ACCESS_KEY"]
                if os.environ.get("AWS_SESSION_TOKEN"):
                    options["token"] = os.environ["AWS_SESSION_TOKEN"]
            elif os.environ.get("AWS_PROFILE"):
                options["profile"] = os.environ["AWS_PROFILE"]
    return options


#: The S3 error code of a request to a bucket that does not exist.
_NO_SUCH_BUCKET = "NoSuchBucket"


def _error_code(exc: BaseException) -> str | None:
    """The S3 error code (``NoSuchBucket``, ``NoSuchKey`` …) of ``exc`` or of the error it was raised from: s3fs
    turns botocore's ``ClientError`` (whose ``response["Error"]["Code"]`` holds the code) into a builtin such as
    FileNotFoundError, raised from it. None when no error in the chain carries one."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        response = getattr(node, "response", None)
        error = response.get("Error") if isinstance(response, dict) else None
        code = error.get("Code") if isinstance(error, dict) else None
        if isinstance(code, str) and code:
            return code
        node = node.__cause__ or node.__context__
    return None


def storage_error(exc: BaseException, what: str, where: str) -> ShardkitError:
    """Any error of a transfer → one line naming the object and what to check; a missing bucket is named as such
    (s3fs reports it as a FileNotFoundError of whatever object was asked for, raised from botocore's error whose
    code says ``NoSuchBucket``)."""
    if _error_code(exc) == _NO_SUCH_BUCKET:
        return _no_bucket(where, f" ({what})")
    if isinstance(exc, FileNotFoundError):
        return InputNotFoundError(f"{what}: no such object", path=where, fix="check the URL")
    if isinstance(exc, PermissionError):
        return StorageError(f"{what}: access denied", path=where,
                            fix="check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID …) and the bucket policy")
    text = " ".join(str(exc).split())[:200] or type(exc).__name__
    return StorageError(f"{what} failed ({type(exc).__name__}: {text})", path=where,
                        fix="check the URL, the endpoint (AWS_ENDPOINT_URL or --storage-option endpoint_url=…), "
                            "the credentials and the network, then re-run")


def _no_bucket(where: str, context: str = "") -> InputNotFoundError:
    parts = urlsplit(where)
    return InputNotFoundError(f"the bucket does not exist{context}", path=f"{parts.scheme}://{parts.netloc}",
                              fix=f"create the bucket {parts.netloc!r} first, or correct the URL (or the "
                                  "endpoint: AWS_ENDPOINT_URL, --storage-option endpoint_url=…)")


class Remote:
    """A folder on object storage: ``url`` plus options; the fsspec filesystem is made lazily per process.

    Picklable (the filesystem is not carried: a worker process makes its own from the options).
    Every method turns errors into one-line :class:`~shardkit.errors.StorageError` s.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = normalize_url(url)
        self.options = resolve_options(self.url, storage_options)
        self._fs: Any = None
        self._fs_pid = 0
        self._root = ""

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options, "_fs": None, "_fs_pid": 0, "_root": ""}

    def __repr__(self) -> str:
        return f"Remote({self.url!r})"

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, made in (and only used by) this process: a forked child makes its own,
        since an async client's event loop does not survive a fork."""
        if self._fs is None or self._fs_pid != os.getpid():
            fsspec = require_fsspec()
            try:
                self._fs, self._root = fsspec.core.url_to_fs(self.url, **self.options)
            except ImportError as exc:
                fix = extra_hint() if self.protocol in ("s3", "s3a") else "install the fsspec backend named here"
                raise StorageError(f"no filesystem for this URL ({exc})", path=self.url, fix=fix) from None
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{self.url}: bad storage options ({exc})",
                                  fix="check --storage-option / storage_options") from None
            self._root = self._root.rstrip("/")
            self._fs_pid = os.getpid()
        return self._fs

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0]

    def path(self, rel: str = "") -> str:
        """The filesystem path of ``rel`` below this folder (no protocol)."""
        _ = self.fs
        return f"{self._root}/{rel}" if rel else self._root

    def url_of(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def token(self) -> str:
        """A short stable name for this URL (cache and staging folder names)."""
        return hashlib.sha256(self.url.encode()).hexdigest()[:16]

    def _call(self, what: str, rel: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (StorageError, ConfigError):
            raise
        except Exception as exc:  # botocore, aiohttp and fsspec errors share no base class
            raise storage_error(exc, what, self.url_of(rel)) from None

    def listing(self, rel: str = "", *, recursive: bool = False) -> dict[str, dict[str, Any]]:
        """{relative path: info} of the files below ``rel`` (recursive) or directly in it; {} if none."""
        base = self.path(rel)

        def run() -> dict[str, dict[str, Any]]:
            fs = self.fs
            try:
                found = (fs.find(base, detail=True) if recursive else
                         {i["name"]: i for i in fs.ls(base, detail=True, refresh=True)})
            except FileNotFoundError:
                return {}
            out = {}
            for name, info in found.items():
                name = name.rstrip("/")
                if info.get("type") == "directory" or not name.startswith(base + "/"):
                    continue
                out[name[len(base) + 1:]] = info
            return out

        self.fs.invalidate_cache(base)
        return dict(self._call("listing", rel, run))

    def subfolders(self, rel: str = "") -> list[str]:
        """Names of the folders directly in ``rel``."""
        base = self.path(rel)

        def run() -> list[str]:
            try:
                entries = self.fs.ls(base, detail=True, refresh=True)
            except FileNotFoundError:
                return []
            return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

        return list(self._call("listing", rel, run))

    def require_present(self) -> None:
        """InputNotFoundError when this URL's bucket does not exist, or when nothing at all is stored under it;
        returns when something is (a caller that looked for a file here and found none then says so itself).
        An endpoint that cannot be reached is the usual one-line StorageError."""
        root = self.path()
        bucket = root.split("/", 1)[0]

        def run() -> str:
            try:
                if self.fs.ls(root, refresh=True):
                    return ""
            except FileNotFoundError:  # s3fs: a prefix with no object under it, or a missing bucket
                pass
            try:
                self.fs.ls(bucket, refresh=True)
            except FileNotFoundError:
                return "bucket"
            return "prefix"

        missing = self._call("listing", "", run)
        if missing == "bucket":
            raise _no_bucket(self.url)
        if missing == "prefix":
            raise InputNotFoundError("nothing is stored under this prefix", path=self.url,
                                     fix="check the URL (the OUTPUT_DIR given to shardkit convert, or one split in it)")

    def info(self, rel: str) -> dict[str, Any] | None:
        """The object's info (size, ETag …), or None if it does not exist (its bucket missing: the one-line error)."""
        def run() -> dict[str, Any] | None:
            try:
                self.fs.invalidate_cache(self.path(rel))
                info = self.fs.info(self.path(rel))
            except FileNotFoundError as exc:
                if _error_code(exc) == _NO_SUCH_BUCKET:
                    raise
                return None
            return info if info.get("type") != "directory" else None

        result: dict[str, Any] | None = self._call("stat", rel, run)
        return result

    def exists(self, rel: str) -> bool:
        return self.info(rel) is not None

    def read_bytes(self, rel: str, limit: int = MAX_SMALL_OBJECT) -> bytes:
        """A small object's content (manifest, record, list file); refused above ``limit`` bytes."""
        info = self.info(rel)
        if info is None:
            raise InputNotFoundError("no such object", path=self.url_of(rel), fix="check the URL")
        if int(info.get("size") or 0) > limit:
            raise StorageError(f"object is {info.get('size')} bytes, more than the {limit} read whole",
                               path=self.url_of(rel), fix="check the URL points at a shardkit file")
        data: bytes = self._call("read", rel, self.fs.cat_file, self.path(rel))
        return data

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        data: bytes = self._call("read", rel, self.fs.cat_file, self.path(rel), start=start, end=end)
        return data

    def download(self, rel: str, local: Path, *, max_bytes: int | None = None) -> None:
        """Copy an object to ``local`` via a temporary name in the same folder (never half a file under it).

        ``max_bytes``: stream it and stop with a one-line error as soon as more arrives (an object replaced
        by a larger one after its size was checked never fills the disk)."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{local.name}.", suffix=".part", dir=local.parent)
        os.close(fd)
        try:
            if max_bytes is None:
                self._call("download", rel, self.fs.get_file, self.path(rel), tmp)
            else:
                self._call("download", rel, self._bounded_get, rel, tmp, max_bytes)
            os.replace(tmp, local)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _bounded_get(self, rel: str, tmp: str, max_bytes: int) -> None:
        got = 0
        with self.fs.open(self.path(rel), "rb", block_size=DOWNLOAD_CHUNK) as src, open(tmp, "wb") as dst:
            while True:
                piece = src.read(min(DOWNLOAD_CHUNK, max_bytes + 1 - got))
                if not piece:
                    return
                got += len(piece)
                if got > max_bytes:
                    raise StorageError(f"object is larger than the {max_bytes} bytes expected: download stopped",
                                       path=self.url_of(rel),
                                       fix="the object was replaced after conversion; re-convert this split")
                dst.write(piece)

    def download_many(self, pairs: list[tuple[str, Path]]) -> None:
        """Several downloads at once (fsspec runs them concurrently where the filesystem is async)."""
        if not pairs:
            return
        for _, local in pairs:
            Path(local).parent.mkdir(parents=True, exist_ok=True)
        self._call("download", pairs[0][0], self.fs.get, [self.path(r) for r, _ in pairs],
                   [os.fspath(p) for _, p in pairs])

    def upload(self, local: Path, rel: str) -> None:
        """Put a local file at ``rel``. An object store writes an object whole or not at all."""
        self._call("upload", rel, self.fs.put_file, os.fspath(local), self.path(rel))

    def write_bytes(self, rel: str, data: bytes, **kwargs: Any) -> Any:
        return self._call("upload", rel, self.fs.pipe_file, self.path(rel), data, **kwargs)

    def copy(self, src: str, dst: str) -> None:
        self._call("copy", src, self.fs.copy, self.path(src), self.path(dst))

    def delete(self, rels: list[str]) -> None:
        if rels:
            self._call("delete", rels[0], self.fs.rm, [self.path(r) for r in rels])


def content_id(info: Mapping[str, Any]) -> str:
    """A digest of what identifies an object's version without reading it: size plus ETag (S3), md5/generation
    (GCS) or modification time — what a re-run compares instead of re-hashing remote inputs."""
    keys = ("ETag", "etag", "md5Hash", "generation", "LastModified", "mtime", "last_modified", "created")
    ident = {k: str(info[k]) for k in keys if info.get(k) is not None}
    ident["size"] = str(info.get("size"))
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
