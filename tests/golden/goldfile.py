"""Writes the golden-file format the C tests read (tests/golden.h):
magic b"DLGOLD1\\0", uint32 version 1, uint32 record count, then per record:
uint32 name length, name (ASCII), uint32 ndim, ndim x int64 shape, float32
values, all little-endian."""
import struct


def write(path, records):
    """records: list of (name, torch tensor); values are written as float32."""
    parts = [b"DLGOLD1\0", struct.pack("<II", 1, len(records))]
    for name, t in records:
        nb = name.encode("ascii")
        parts.append(struct.pack("<I", len(nb)))
        parts.append(nb)
        parts.append(struct.pack("<I", t.dim()))
        parts.append(struct.pack("<%dq" % t.dim(), *t.shape))
        vals = t.reshape(-1).tolist()
        parts.append(struct.pack("<%df" % len(vals), *vals))
    blob = b"".join(parts)
    with open(path, "wb") as f:
        f.write(blob)
    print("%s: %d records, %d bytes" % (path, len(records), len(blob)))
