"""One exception hierarchy for everything shardkit reports to a user.

Every error is a :class:`ShardkitError` *and* the builtin that best matches it, so
callers may catch either. Messages are one line: the file, the problem, the fix.
The CLI maps any ShardkitError to exit code 1 (usage errors are 2).
"""

from __future__ import annotations

from pathlib import Path


class ShardkitError(Exception):
    """Base of every error shardkit raises on purpose."""

    def __init__(self, message: str, *, path: str | Path | None = None, fix: str | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.fix = fix
        #: the file and the problem without the fix (e.g. for a skipped input, whose fix was already taken)
        self.problem = f"{self.path}: {message}" if self.path else message
        parts = [self.problem]
        if fix:
            parts.append(f"fix: {fix}")
        super().__init__(" — ".join(parts))


class ConfigError(ShardkitError, ValueError):
    """Options that contradict each other or cannot be satisfied."""


class InputNotFoundError(ShardkitError, FileNotFoundError):
    """A source folder, file or list entry that does not exist."""


class InputChangedError(ShardkitError, RuntimeError):
    """An input file that changed (rewritten, replaced, touched, removed) while a conversion read it: the version
    would mix old and new inputs, so it is not published (``--on-error skip``: the sample is left out)."""


class LayoutError(ShardkitError, ValueError):
    """The input folder matches no known dataset layout, or is ambiguous."""


class DecodeError(ShardkitError, ValueError):
    """An image or label file that cannot be decoded (corrupt, truncated, not an image)."""


class LabelError(ShardkitError, ValueError):
    """A label with values that do not map to a class (unknown colour, id out of range, size mismatch)."""


class ShardFormatError(ShardkitError, ValueError):
    """A shard or manifest on disk that is malformed, truncated, or of an unsupported version."""


class UnsafePathError(ShardkitError, PermissionError):
    """A path in a manifest or list file that would escape its folder."""


class IntegrityError(ShardkitError, ValueError):
    """A shard whose size or sha256 disagrees with its manifest."""


class WorkerError(ShardkitError, RuntimeError):
    """A worker process died or failed in a way that is not the input's fault."""


class OutputError(ShardkitError, OSError):
    """The output folder cannot be written (exists, inside the input, disk full, locked)."""


class StorageError(ShardkitError, OSError):
    """Object storage cannot be reached or refuses a transfer (endpoint, credentials, missing extra)."""


class DuplicateError(ShardkitError, ValueError):
    """Identical images in the input where ``convert --on-duplicate error`` allows none (exit code 4)."""


class ResumeError(ShardkitError, ValueError):
    """A loader state that does not belong to this loader (another dataset version, split, augmentation or order),
    or that is malformed."""
