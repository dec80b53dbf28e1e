"""A ROCm library's build packing its kernels through the reference
``rocm_kpack`` library API, timed on whichever ``rocm_kpack`` this Python
imports: upstream's pure-Python package or kpack's wheel (section
``python`` of ``cargo xtask bench``, kpack-bench/src/sections/python_upstream.rs,
runs it in one environment of each).

The job, per archive: ``PackedKernelArchive`` with ``ZstdCompressor(3)`` or
``NoOpCompressor``, ``prepare_kernel`` of its kernels on a thread pool (one
thread per core, made once), ``add_kernel`` in order, ``finalize_archive``,
``write`` into an output directory that is new for each run; then reading
back: ``PackedKernelArchive.read`` of each archive and ``get_kernel`` of
every kernel (checked against the input on a first run, not counted).

Kernels: prefixes of the real code objects in KERNEL_DIR, of sizes drawn
log-uniformly between LO and HI bytes (fixed seed), each made distinct by
8 bytes of its index appended.

With ``--floor`` it times instead what any implementation of the job has
to do, with nothing of ``rocm_kpack``: the same thread pool handing out the
kernels (compressed by ``zstandard`` with one context kept per thread, for
zstd), each archive's bytes written into a new file as they are (``writelines``),
and read back with one ``read`` per archive, each kernel cut out of it
(decompressed by one kept context, for zstd).

argv: KERNEL_DIR WORKDIR REPS LO HI [--floor]. Prints one JSON object: for
each shape and compressor, the wall times of every run of pack (+ write)
and read."""

import json
import os
import random
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import threading

import zstandard

floor = "--floor" in sys.argv[6:]
if not floor:
    import rocm_kpack
    from rocm_kpack.compression import NoOpCompressor, ZstdCompressor
    from rocm_kpack.kpack import PackedKernelArchive

kernel_dir, work, reps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
lo, hi = int(sys.argv[4]), int(sys.argv[5])
sources = [p.read_bytes() for p in sorted(kernel_dir.iterdir()) if p.is_file()]
rng = random.Random(32)


def kernel(i):
    src = sources[i % len(sources)]
    size = min(len(src), int(lo * (hi / lo) ** rng.random()))
    return src[:size] + i.to_bytes(8, "little")


def shape(counts):
    """Archives holding these numbers of kernels (keys ``lib/lib<a>.so#<k>``)."""
    out, n = [], 0
    for a, count in enumerate(counts):
        out.append([(f"lib/lib{a}.so#{k}", kernel(n + k)) for k in range(count)])
        n += count
    return out


def uneven(total, archives):
    """``total`` kernels over ``archives`` archives, 1 to 6 each (fixed)."""
    counts = [1] * archives
    r = random.Random(142)
    while sum(counts) < total:
        i = r.randrange(archives)
        if counts[i] < 6:
            counts[i] += 1
    return counts


SHAPES = {
    "a": ("50 archives x 3 kernels", [3] * 50),
    "b": ("142 code objects into 50 archives", uneven(142, 50)),
    "c": ("one archive of 300 kernels", [300]),
    "d": ("200 archives x 1 kernel", [1] * 200),
}
COMPRESSORS = ["zstd", "none"]
ARCH = "gfx1030"
pool = ThreadPoolExecutor(os.cpu_count() or 2)


def pack(archives, cname, out):
    for a, kernels in enumerate(archives):
        make = ZstdCompressor if cname == "zstd" else NoOpCompressor
        archive = PackedKernelArchive("bench", ARCH, [ARCH], compressor=make())
        for p in pool.map(lambda k: archive.prepare_kernel(k[0], ARCH, k[1]), kernels):
            archive.add_kernel(p)
        archive.finalize_archive()
        archive.write(out / f"bench{a}-{ARCH}.kpack")


local = threading.local()


def frame(data):
    c = getattr(local, "c", None)
    if c is None:
        c = local.c = zstandard.ZstdCompressor(level=3)
    return c.compress(data)


def floor_pack(archives, cname, out, sizes):
    for a, kernels in enumerate(archives):
        if cname == "zstd":
            parts = list(pool.map(lambda k: frame(k[1]), kernels))
        else:
            parts = list(pool.map(lambda k: k[1], kernels))
        sizes[a] = [len(p) for p in parts]
        with open(out / f"bench{a}-{ARCH}.kpack", "wb") as f:
            f.writelines(parts)


def floor_read(archives, cname, out, sizes):
    d = zstandard.ZstdDecompressor()
    for a, kernels in enumerate(archives):
        with open(out / f"bench{a}-{ARCH}.kpack", "rb") as f:
            data = f.read()
        pos = 0
        for n in sizes[a]:
            part = data[pos : pos + n]
            if cname == "zstd":
                d.decompress(part)
            pos += n


def read(archives, out, check):
    for a, kernels in enumerate(archives):
        archive = PackedKernelArchive.read(out / f"bench{a}-{ARCH}.kpack")
        for key, data in kernels:
            got = archive.get_kernel(key, ARCH)
            if check and got != data:
                raise SystemExit(f"{key}: read back differs")


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


results = {}
for name, (what, counts) in SHAPES.items():
    archives = shape(counts)
    kernels = sum(counts)
    size = sum(len(d) for ks in archives for _, d in ks)
    entry = {"what": what, "archives": len(counts), "kernels": kernels, "bytes": size}
    for cname in COMPRESSORS:
        runs = {"pack_s": [], "read_s": []}
        # A first run, not counted, checks what is read back.
        for rep in range(reps + 1):
            out = work / f"{name}-{cname}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            if floor:
                sizes = {}
                t_pack = timed(lambda: floor_pack(archives, cname, out, sizes))
                t_read = timed(lambda: floor_read(archives, cname, out, sizes))
            else:
                t_pack = timed(lambda: pack(archives, cname, out))
                t_read = timed(lambda: read(archives, out, rep == 0))
            if rep > 0:
                runs["pack_s"].append(t_pack)
                runs["read_s"].append(t_read)
        entry[cname] = runs
    results[name] = entry
shutil.rmtree(work, ignore_errors=True)
package = "floor" if floor else os.path.dirname(rocm_kpack.__file__)
print(json.dumps({"package": package, "shapes": results}))
