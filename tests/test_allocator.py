"""The CPU path's allocator policy: set on glibc unless the user chose one."""

from __future__ import annotations

import ctypes.util

import pytest

from batchgen import allocator


@pytest.mark.parametrize(
    ("environ", "chose"),
    [
        ({}, False),
        ({"PATH": "/bin"}, False),
        ({"MALLOC_ARENA_MAX": "2"}, True),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, True),
        ({"BATCHGEN_KEEP_FREED_MEMORY": "0"}, True),
        ({"BATCHGEN_KEEP_FREED_MEMORY": "1"}, False),
    ],
)
def test_the_user_choice_wins(environ, chose):
    assert allocator.user_chose_allocator(environ) is chose


def test_thresholds_are_set_on_glibc(monkeypatch):
    for key in [k for k in allocator.os.environ if k.startswith("MALLOC_") or k == "LD_PRELOAD"]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("BATCHGEN_KEEP_FREED_MEMORY", raising=False)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    assert allocator.keep_freed_memory() is hasattr(libc, "gnu_get_libc_version")
    monkeypatch.setenv("BATCHGEN_KEEP_FREED_MEMORY", "0")
    assert allocator.keep_freed_memory() is False
