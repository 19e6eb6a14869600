"""Optional compiled kernels (shardkit's ``fast`` extra brings numba): one place that compiles them.

Each user (one-hot, the augmentation label gather) keeps its plain-Python loop next to the numpy
code it replaces and holds a :class:`LazyKernels` that compiles them on first use; without numba, with
``SHARDKIT_NO_NUMBA=1``, or when compiling fails, it gets ``None`` and runs numpy instead.
Kernels are compiled with numba's defaults otherwise (no ``fastmath``: float operations stay in
source order, unfused), so a compiled loop computes what the same loop computes in Python.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)


def disabled() -> bool:
    """True when ``SHARDKIT_NO_NUMBA`` is set (to anything but 0): compiled kernels are then never used."""
    return os.environ.get("SHARDKIT_NO_NUMBA", "") not in ("", "0")


def compile_kernels(funcs: Sequence[Callable[..., Any]], warm: Callable[[tuple[Any, ...]], None],
                    what: str) -> tuple[Any, ...] | None:
    """``funcs`` compiled by numba (cached on disk when it can be, else compiled anyway), then ``warm``
    called with them so that a compiler or cache failure lands here; None without numba or on failure."""
    if disabled():
        return None
    return _compile(funcs, warm, what, cache=True) or _compile(funcs, warm, what, cache=False)


class LazyKernels:
    """``funcs`` compiled by :func:`compile_kernels` on first use, once per process and thread-safely.

    :meth:`get` gives the compiled tuple, or None without numba (or with ``SHARDKIT_NO_NUMBA=1``, checked
    on every call, so the switch works after a first compile)."""

    def __init__(self, funcs: Sequence[Callable[..., Any]], warm: Callable[[tuple[Any, ...]], None],
                 what: str) -> None:
        self.funcs, self.warm, self.what = tuple(funcs), warm, what
        self._lock = threading.Lock()
        self._tried = False
        self._kernels: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        if disabled():
            return None
        with self._lock:
            if not self._tried:
                self._kernels = compile_kernels(self.funcs, self.warm, self.what)
                self._tried = True
            return self._kernels

    def name(self) -> str:
        """Which kernels run here: ``"numba"`` or ``"numpy"`` (benchmarks print it)."""
        return "numba" if self.get() is not None else "numpy"

    def fresh(self) -> LazyKernels:
        """The same kernels, not compiled yet (tests swap it in to compile again)."""
        return LazyKernels(self.funcs, self.warm, self.what)


def _compile(funcs: Sequence[Callable[..., Any]], warm: Callable[[tuple[Any, ...]], None], what: str,
             cache: bool) -> tuple[Any, ...] | None:
    try:
        import numba

        jit = numba.njit(cache=cache, nogil=True, boundscheck=False)
        kernels = tuple(jit(f) for f in funcs)
        warm(kernels)
        return kernels
    except Exception as exc:  # not installed, no usable cache, no compiler: numpy does it
        log.debug("numba %s kernels unavailable (cache=%s: %s)", what, cache, exc)
        return None
