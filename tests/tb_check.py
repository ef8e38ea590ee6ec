#!/usr/bin/env python3
"""tests/tb_check.py - reads an events file written by dl.h's dl_summary_*
with TensorBoard's own loaders and checks it against the expectations that
tests/test_summary.c writes next to it:

    python3 tests/tb_check.py build/tb_summary/expect.txt

expect.txt, one item a line:
    file PATH                                   the events file
    scalar TAG STEP VALUE
    histo TAG STEP V1 V2 ...                    the raw values
    image TAG STEP HEIGHT WIDTH CHANNELS HEX    the pixels, row-major HWC bytes
    graph NODES                                 graph events, in order

Checks: every record's CRCs (TensorBoard's reader), every Event (and GraphDef)
re-serializes to the same bytes with protobuf (deterministic=True), the first
record is file_version brain.Event:2; scalars, histogram statistics and
bucket counts (TensorFlow's default buckets, counted here independently),
image size and pixels (decoded by PIL when importable, and by zlib), graph
node counts, and TensorBoard's data_compat conversion (what its UI shows).
Then the file is cut at every byte of its last record: the loader must
return every earlier record. Exits 0 when everything holds; needs the
`tensorboard` package (pip install tensorboard), else exits 0 with SKIP.
"""
import bisect
import io
import logging
import os
import struct
import sys
import tempfile
import zlib

try:
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing import event_file_loader as efl
    from tensorboard.compat.proto import event_pb2, graph_pb2
    from tensorboard import data_compat
    from tensorboard.util import tensor_util
except ImportError:
    print("SKIP tensorboard reader: python package tensorboard not installed (pip install tensorboard)")
    sys.exit(0)
try:
    from PIL import Image
except ImportError:
    Image = None

failures = 0
checks = 0


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL tb_check: " + what)


def tf_default_limits():
    pos, v = [], 1e-12
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    big = sys.float_info.max
    return [-big] + [-x for x in reversed(pos)] + [0.0] + pos + [big]


def tf_histogram(values):
    """Histogram::Add (upper_bound) and EncodeToProto (empty runs merged),
    from the first to the last non-empty bucket."""
    lims = tf_default_limits()
    counts = [0.0] * len(lims)
    for v in values:
        counts[min(bisect.bisect_right(lims, v), len(lims) - 1)] += 1
    nz = [i for i, c in enumerate(counts) if c > 0]
    out_l, out_c, i, last = [], [], nz[0], nz[-1]
    while i <= last:
        end, c = lims[i], counts[i]
        i += 1
        if c <= 0:
            while i <= last and counts[i] <= 0:
                end = lims[i]
                i += 1
        out_l.append(end)
        out_c.append(c)
    return out_l, out_c


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def png_pixels_zlib(png):
    """(width, height, color type, HWC bytes) with the standard library."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    off, idat, ihdr = 8, b"", None
    while off < len(png):
        (n,) = struct.unpack(">I", png[off:off + 4])
        typ, data = png[off + 4:off + 8], png[off + 8:off + 8 + n]
        (crc,) = struct.unpack(">I", png[off + 8 + n:off + 12 + n])
        assert zlib.crc32(typ + data) == crc, "chunk CRC"
        if typ == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", data)
        elif typ == b"IDAT":
            idat += data
        off += 12 + n
    w, h, depth, ctype = ihdr[0], ihdr[1], ihdr[2], ihdr[3]
    assert depth == 8
    raw = zlib.decompress(idat)        # checks the Adler-32
    ch = {0: 1, 2: 3, 6: 4}[ctype]
    stride = 1 + w * ch
    assert len(raw) == h * stride
    rows = []
    for y in range(h):
        assert raw[y * stride] == 0    # filter type None
        rows.append(raw[y * stride + 1:(y + 1) * stride])
    return w, h, ctype, b"".join(rows)


def frames(data):
    """Offsets of the whole TFRecord frames in data."""
    off, out = 0, []
    while off + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[off:off + 8])
        if off + 16 + n > len(data):
            break
        out.append(off)
        off += 16 + n
    return out


def main():
    # the second graph event replaces the first, as the test means it to
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    exp = {"scalar": [], "histo": [], "image": [], "graph": []}
    path = None
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            p = line.split()
            if not p:
                continue
            if p[0] == "file":
                path = p[1]
            else:
                exp[p[0]].append(p[1:])

    # 1. every record through TensorBoard's own reader (checks both CRCs)
    raw = list(efl.RawEventFileLoader(path).Load())
    with open(path, "rb") as f:
        data = f.read()
    offs = frames(data)
    check(len(raw) == len(offs) and len(raw) > 0, "loader read %d records, the file has %d" % (len(raw), len(offs)))
    events = [event_pb2.Event.FromString(r) for r in raw]
    for i, (r, ev) in enumerate(zip(raw, events)):
        check(ev.SerializeToString(deterministic=True) == r, "record %d: protobuf re-serializes it differently" % i)
        if ev.HasField("graph_def"):
            g = graph_pb2.GraphDef.FromString(ev.graph_def)
            check(g.SerializeToString(deterministic=True) == ev.graph_def, "record %d: GraphDef re-serializes differently" % i)
    check(events[0].file_version == "brain.Event:2" and events[0].wall_time > 1.6e9, "first record: file_version")

    # 2. the accumulator TensorBoard uses for legacy summaries
    acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.IMAGES: 0,
                                                    ea.COMPRESSED_HISTOGRAMS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    for tag, step, value in exp["scalar"]:
        got = [e for e in acc.Scalars(tag) if e.step == int(step)] if tag in tags["scalars"] else []
        check(len(got) == 1 and got[0].value == f32(float(value)), "scalar %s step %s: %s" % (tag, step, got))
    for h in exp["histo"]:
        tag, step, values = h[0], int(h[1]), [f32(float(v)) for v in h[2:]]
        got = [e for e in acc.Histograms(tag) if e.step == step] if tag in tags["histograms"] else []
        check(len(got) == 1, "histogram %s step %d found" % (tag, step))
        if not got:
            continue
        hv = got[0].histogram_value
        lims, counts = tf_histogram(values)
        check(hv.num == len(values) and hv.min == min(values) and hv.max == max(values),
              "histogram %s: num/min/max %g %g %g" % (tag, hv.num, hv.min, hv.max))
        check(abs(hv.sum - sum(values)) <= 1e-9 * max(1.0, abs(sum(values))) and
              abs(hv.sum_squares - sum(v * v for v in values)) <= 1e-9 * sum(v * v for v in values),
              "histogram %s: sum/sum_squares" % tag)
        check(list(hv.bucket_limit) == lims, "histogram %s: bucket limits are TF's default buckets" % tag)
        check(list(hv.bucket) == counts and sum(hv.bucket) == len(values), "histogram %s: counts %s" % (tag, list(hv.bucket)))
    for tag, step, hh, ww, ch, hexpix in exp["image"]:
        got = [e for e in acc.Images(tag) if e.step == int(step)] if tag in tags["images"] else []
        check(len(got) == 1, "image %s step %s found" % (tag, step))
        if not got:
            continue
        im = got[0]
        check(im.height == int(hh) and im.width == int(ww), "image %s: %dx%d" % (tag, im.width, im.height))
        w, h, ctype, pix = png_pixels_zlib(im.encoded_image_string)
        check((w, h) == (int(ww), int(hh)) and pix == bytes.fromhex(hexpix), "image %s: pixels (zlib)" % tag)
        if Image is not None:
            pim = Image.open(io.BytesIO(im.encoded_image_string))
            pim.load()
            mode = {"1": "L", "3": "RGB", "4": "RGBA"}[ch]
            check(pim.size == (int(ww), int(hh)) and pim.mode == mode and pim.tobytes() == bytes.fromhex(hexpix),
                  "image %s: PIL decodes %s %s" % (tag, pim.size, pim.mode))
    graphs = [graph_pb2.GraphDef.FromString(ev.graph_def) for ev in events if ev.HasField("graph_def")]
    check([len(g.node) for g in graphs] == [int(g[0]) for g in exp["graph"]],
          "graph node counts %s" % [len(g.node) for g in graphs])
    if graphs:
        last = acc.Graph()
        check(len(last.node) == len(graphs[-1].node), "EventAccumulator.Graph(): the last graph")
        names = set(n.name for n in graphs[0].node)
        check(len(names) == len(graphs[0].node), "graph node names are unique")
        check(all(i in names for n in graphs[0].node for i in n.input), "every input names a node")
        check(all("_output_shapes" in n.attr and len(n.attr["_output_shapes"].list.shape) == 1 for n in graphs[0].node),
              "every node has _output_shapes")

    # 3. what TensorBoard's UI reads: data_compat's migration to tensors
    for ev in events:
        for v in ev.summary.value:
            m = data_compat.migrate_value(v)
            name = m.metadata.plugin_data.plugin_name
            if v.HasField("histo"):
                b = tensor_util.make_ndarray(m.tensor)      # (k, 3): left, right, count
                check(name == "histograms" and b.shape[1] == 3 and b[:, 2].sum() == v.histo.num and
                      (b[:, 0] <= b[:, 1]).all() and b[0, 0] == f32(v.histo.min) and b[-1, 1] == f32(v.histo.max),
                      "histo %s migrates: %s" % (v.tag, b.tolist()))
            elif v.HasField("image"):
                check(name == "images" and len(m.tensor.string_val) == 3 and
                      m.tensor.string_val[0] == str(v.image.width).encode(), "image %s migrates" % v.tag)
            else:
                check(name == "scalars", "scalar %s migrates" % v.tag)

    # 4. cut at every byte of the last record: every earlier record loads
    last = offs[-1]
    bad = []
    with tempfile.TemporaryDirectory() as d:
        cut_path = os.path.join(d, "events.out.tfevents.cut")
        for cut in range(last, len(data)):
            with open(cut_path, "wb") as f:
                f.write(data[:cut])
            n = len(list(efl.RawEventFileLoader(cut_path).Load()))
            if n != len(offs) - 1:
                bad.append((cut, n))
        with open(cut_path, "wb") as f:
            f.write(data[:last + (len(data) - last) // 2])
        acc2 = ea.EventAccumulator(cut_path, size_guidance={ea.SCALARS: 0})
        acc2.Reload()
        nsc = sum(len(acc2.Scalars(t)) for t in acc2.Tags()["scalars"])
    check(not bad, "truncated last record: %d of %d cuts lose earlier records %s" % (len(bad), len(data) - last, bad[:5]))
    check(nsc == len(exp["scalar"]), "truncated file: EventAccumulator still has the %d scalars" % nsc)

    print("tb_check.py: %d checks, %d failed (%d records, tensorboard %s, PIL %s): %s"
          % (checks, failures, len(raw), __import__("tensorboard").__version__,
             "yes" if Image is not None else "no", path))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
