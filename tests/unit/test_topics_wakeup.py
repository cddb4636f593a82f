"""``topics.wakeup.readable``: a pointer is passed to librdkafka only where memory is mapped."""

from __future__ import annotations

import ctypes
import mmap

from topics.wakeup import readable

PROT_NONE = 0  # <sys/mman.h>; Python's mmap module does not name it


def test_a_live_buffer_is_readable_and_a_low_address_is_not() -> None:
    buf = ctypes.create_string_buffer(64)
    assert readable(ctypes.addressof(buf), 64)
    assert not readable(0, 8)
    assert not readable(8, 8)


def test_a_page_closed_to_reads_is_refused_and_so_is_a_span_into_it() -> None:
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    region = mmap.mmap(-1, 2 * page)
    view = ctypes.c_char.from_buffer(region)
    start = ctypes.addressof(view)
    try:
        assert readable(start, 2 * page)
        assert libc.mprotect(start + page, page, PROT_NONE) == 0, ctypes.get_errno()
        assert readable(start, page)
        assert not readable(start + page, 1)
        assert not readable(start, 2 * page)
        assert libc.mprotect(start + page, page, mmap.PROT_READ | mmap.PROT_WRITE) == 0
    finally:
        del view
        region.close()
