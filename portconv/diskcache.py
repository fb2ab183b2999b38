"""portconv's files under PORTCONV_CACHE_DIR: private folders, and binaries checked against a digest before use."""
from __future__ import annotations

import hashlib
import os
import pathlib
import stat
import threading
import warnings

# Note [trusted cache]
# A kernel binary read from disk is loaded into the GPU driver as it is, so the cache must not be a way in:
# - folders are created private to the user (0700);
# - a folder that another user owns, or that anyone but its owner may write (group or other write bit, as in
#   /tmp without its sticky-bit protection of entries), is not trusted: nothing is read from it or written to it,
#   with one warning, and kernels are compiled in memory instead;
# - each binary file is "PCB1" + the SHA-256 of its payload + the payload; a file that is short, corrupt or replaced
#   fails that check, is rebuilt with one warning, and never reaches the driver.
# The check catches damage and other users; a process of the same user can always rewrite its own cache.
MAGIC = b"PCB1"
_DIGEST = 32


class CacheWarning(UserWarning):
    """A cache folder or file was not usable; portconv goes on without it."""


_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, text: str, category: type[Warning] = CacheWarning, stacklevel: int = 2) -> None:
    """Warn ``text`` the first time ``key`` is seen in this process (a cache's trouble is said once)."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"portconv: {text}", category, stacklevel=stacklevel + 1)


def _warn_once(key: str, text: str) -> None:
    warn_once(key, text, CacheWarning, 3)


def untrusted(folder: pathlib.Path) -> str:
    """Why ``folder`` (which exists) is not trusted, or ''."""
    st = folder.stat()
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def folder(path: pathlib.Path | str) -> pathlib.Path | None:
    """``path`` made (0700) if absent, or None with one warning when it cannot be made or is not trusted."""
    path = pathlib.Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        _warn_once(f"mkdir {path}", f"cannot use the cache folder {path} ({type(e).__name__}: {e}); "
                   "PORTCONV_CACHE_DIR must name a folder this user can create or write; going on without it")
        return None
    why = untrusted(path)
    if why:
        _warn_once(f"trust {path}", f"not using the cache folder {path}: {why} (Note [trusted cache]); kernels are "
                   "compiled in memory instead")
        return None
    return path


def read(path: pathlib.Path) -> bytes | None:
    """The payload of a binary written by write(), or None (absent, or failed its check: one warning, removed)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn_once(f"read {path}", f"cannot read the cached binary {path} ({e}); rebuilding it")
        return None
    head, digest, payload = data[:len(MAGIC)], data[len(MAGIC):len(MAGIC) + _DIGEST], data[len(MAGIC) + _DIGEST:]
    if head == MAGIC and len(digest) == _DIGEST and payload and hashlib.sha256(payload).digest() == digest:
        return payload
    _warn_once(f"check {path.parent}", f"the cached binary {path} failed its digest check (short, corrupt or "
               "replaced); rebuilding it (one warning a folder)")
    try:
        path.unlink()
    except OSError:
        pass
    return None


def write(path: pathlib.Path, payload: bytes) -> None:
    """Write MAGIC + digest + payload via a temporary file and a rename (readers never see half a file); a failure
    costs a rebuild next process, one warning."""
    try:
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    except OSError as e:
        _warn_once(f"write {path.parent}", f"cannot write the kernel cache {path} ({e}); it is rebuilt next process")
