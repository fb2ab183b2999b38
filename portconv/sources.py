"""Where the kernel source folders are: portconv/_src/<vendor> in a wheel, <repo>/<vendor> in a checkout."""
from __future__ import annotations

import hashlib
import pathlib

_PKG = pathlib.Path(__file__).resolve().parent


def folder(vendor: str) -> pathlib.Path:
    """The directory of one kernel set ('cuda', 'hip', 'opencl'); raises FileNotFoundError if absent."""
    for cand in (_PKG / "_src" / vendor, _PKG.parent / vendor):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"portconv kernel sources for {vendor!r} not found under {_PKG / '_src'} or {_PKG.parent}")


def read(vendor: str, name: str) -> str:
    return (folder(vendor) / name).read_text()


def digest(vendor: str) -> str:
    """A hash of every source file of one kernel set (part of every compile-cache key)."""
    h = hashlib.sha256()
    base = folder(vendor)
    for p in sorted(base.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(base).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]
