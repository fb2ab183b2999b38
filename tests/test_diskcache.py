"""Note [trusted cache]: private cache folders, untrusted ones refused, binaries checked before use."""
from __future__ import annotations

import os
import stat

import pytest

from portconv import diskcache
from portconv.diskcache import CacheWarning


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(diskcache, "_warned", set())


def test_folders_are_made_private(tmp_path):
    got = diskcache.folder(tmp_path / "a" / "cuda")
    assert got == tmp_path / "a" / "cuda" and stat.S_IMODE(got.stat().st_mode) == 0o700


def test_a_folder_others_may_write_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(CacheWarning, match=r"others may write to it \(mode 777\)"):
        assert diskcache.folder(shared) is None
    shared.chmod(0o775)
    diskcache._warned.clear()  # one warning a folder and process
    with pytest.warns(CacheWarning, match="mode 775"):
        assert diskcache.folder(shared) is None
    shared.chmod(0o700)
    assert diskcache.folder(shared) == shared


def test_a_cache_dir_naming_a_file_says_so(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.warns(CacheWarning, match="PORTCONV_CACHE_DIR must name a folder"):
        assert diskcache.folder(f / "cuda") is None


def test_binaries_round_trip_and_every_damage_is_rebuilt(tmp_path):
    path = tmp_path / "k.bin"
    payload = os.urandom(5000)
    diskcache.write(path, payload)
    assert diskcache.read(path) == payload and stat.S_IMODE(path.stat().st_mode) == 0o600
    good = path.read_bytes()
    damaged = {"truncated": good[:-100], "header only": good[:36], "empty": b"",
               "flipped": good[:-1] + bytes([good[-1] ^ 1]), "replaced": b"\x7fELF" + os.urandom(4000),
               "raw binary of an older portconv": payload}
    for what, data in damaged.items():
        diskcache._warned.clear()
        path.write_bytes(data)
        with pytest.warns(CacheWarning, match="failed its digest check"):
            assert diskcache.read(path) is None, what
        assert not path.exists(), what  # removed: the rebuild writes a good one
    assert diskcache.read(tmp_path / "absent.bin") is None
