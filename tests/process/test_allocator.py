"""``train.allocator``: glibc's threshold fixed so that freed tensors leave the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from adaqp.process import allocator
from adaqp.process.allocator import MMAP_THRESHOLD_BYTES, huge_pages_offered, planned


@pytest.mark.parametrize(
    ("text", "offered"),
    [
        ("always [madvise] never\n", True),
        ("[always] madvise never\n", True),
        ("always madvise [never]\n", False),
        ("", False),
    ],
)
def test_huge_pages_read_from_the_kernels_mode(tmp_path, text, offered):
    setting = tmp_path / "enabled"
    setting.write_text(text)
    assert huge_pages_offered(setting) is offered


def test_huge_pages_not_offered_where_the_kernel_says_nothing(tmp_path):
    assert huge_pages_offered(tmp_path / "missing") is False


def test_plans(monkeypatch):
    monkeypatch.setattr(allocator, "huge_pages_offered", lambda: True)
    setting = allocator.AllocatorSetting
    assert planned("release", {}) == setting("release", MMAP_THRESHOLD_BYTES, True)
    assert planned("glibc", {}) == setting("glibc", None, False)
    # what the user set in the environment is kept
    user = {"MALLOC_MMAP_THRESHOLD_": "4194304", "THP_MEM_ALLOC_ENABLE": "0"}
    assert planned("release", user) == setting("release", 4194304, False)
    monkeypatch.setattr(allocator, "huge_pages_offered", lambda: False)
    assert planned("release", {}).huge_pages is False
    with pytest.raises(ValueError, match="one of release, glibc"):
        planned("jemalloc", {})


PROBE = """
import ctypes, sys
from adaqp.process.allocator import configure

class Info(ctypes.Structure):  # glibc's struct mallinfo2
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = Info
setting = configure(sys.argv[1])
# glibc's sliding threshold rises to a freed mapped block's size: a later, smaller block
# then comes from the heap, and stays there once freed.
libc.free(libc.malloc(8 << 20))
block = libc.malloc(4 << 20)
print(libc.mallinfo2().hblkhd >= 4 << 20, setting.threshold_bytes)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize(("choice", "mapped"), [("release", "True"), ("glibc", "False")])
def test_a_freed_block_leaves_the_process_only_under_release(choice, mapped):
    env = {"PATH": "/usr/bin:/bin"}
    probe = textwrap.dedent(PROBE)
    out = subprocess.run(
        [sys.executable, "-c", probe, choice], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    assert out[0] == mapped
    assert out[1] == (str(MMAP_THRESHOLD_BYTES) if choice == "release" else "None")
