"""Consistent Overhead Byte Stuffing: any bytes in, bytes without a single zero out.

A serial line has no packet boundaries, so the link ends every packet with one 0x00 byte and
COBS guarantees that byte appears nowhere else. The encoding splits the input at its zeros into
runs; each run is written as a code byte (the run's length + 1) followed by the run. A code of
0xFF means "254 bytes and no zero after them", which bounds the overhead at one byte per 254.
"""

from __future__ import annotations


class CobsError(ValueError):
    """Bytes that no COBS encoder could have produced."""


_MAX_RUN = 254


def encode(data: bytes) -> bytes:
    out = bytearray()
    # Each zero-free piece between zeros becomes a run; a piece longer than 254 bytes is cut
    # into 0xFF blocks first. The last piece always gets its code byte, even when empty: it
    # stands for the implied trailing zero the decoder drops.
    for piece in bytes(data).split(b"\x00"):
        start = 0
        while len(piece) - start >= _MAX_RUN:
            out.append(0xFF)
            out += piece[start:start + _MAX_RUN]
            start += _MAX_RUN
        out.append(len(piece) - start + 1)
        out += piece[start:]
    return bytes(out)


def decode(data: bytes) -> bytes:
    out = bytearray()
    index = 0
    end = len(data)
    while index < end:
        code = data[index]
        if code == 0:
            raise CobsError(f"zero byte at offset {index} inside a COBS packet")
        run_end = index + code
        if run_end > end:
            raise CobsError(f"run at offset {index} claims {code - 1} bytes, "
                            f"only {end - index - 1} remain")
        run = data[index + 1:run_end]
        if 0 in run:
            raise CobsError(f"zero byte inside the run at offset {index}")
        out += run
        index = run_end
        # A run shorter than 254 stands for "run, then a zero", except at the very end.
        if code != 0xFF and index < end:
            out.append(0)
    return bytes(out)
