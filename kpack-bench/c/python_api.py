"""kpack's Python API against the kpack command and pure Python
(`cargo xtask bench --only python`; kpack-bench/src/sections/python.rs runs it in a
fresh environment holding the release wheel, PyPI's zstandard and msgpack).

argv: KPACK FAT_BINARY TARGET WORKDIR REPS. Prints one JSON object."""

import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import zstandard

import kpack
from rocm_kpack.compression import ZstdCompressor
from rocm_kpack.kpack import PackedKernelArchive

kpack_exe, fat, target, work, reps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
name = fat.name

# The code objects, with the keys and metadata kpack's writers give them.
extracted = work / "extracted"
files = json.loads(subprocess.run([kpack_exe, "extract", fat, "-o", extracted, "--target", target, "--json"],
                                  check=True, capture_output=True, text=True).stdout)
kernels = []
for f in files:
    kernels.append((f"lib/{name}#{f['bundle']}", (extracted / f["file"]).read_bytes(),
                    f"hipv4-amdgcn-amd-amdhsa--{f['target']}"))
total = sum(len(d) for _, d, _ in kernels)


def median(f):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cli():
    tree = work / "tree"
    if not tree.exists():
        (tree / "lib").mkdir(parents=True)
        shutil.copy(fat, tree / "lib" / name)
    subprocess.run([kpack_exe, "pack-tree", "--input", tree, "--output", work / "packed", "--group-name", "g",
                    "--gfx-arches", target, "--jobs", "2", "--overwrite"], check=True, capture_output=True)


def api():
    a = PackedKernelArchive("g", target, [target], compressor=ZstdCompressor(3))
    with ThreadPoolExecutor(2) as pool:
        prepared = list(pool.map(lambda k: a.prepare_kernel(k[0], target, k[1], {"target": k[2]}), kernels))
    for p in prepared:
        a.add_kernel(p)
    a.finalize_archive()
    a.write(work / "api.kpack")


def pure_python():
    def frame(k):
        return zstandard.ZstdCompressor(level=3).compress(k[1])

    with ThreadPoolExecutor(2) as pool:
        frames = list(pool.map(frame, kernels))
    blob = bytearray(struct.pack("<I", len(frames)))
    for f in frames:
        blob += struct.pack("<I", len(f)) + f
    toc = {"format_version": 1, "group_name": "g", "gfx_arch_family": target, "gfx_arches": [target],
           "toc": {k: {target: {"type": "hsaco", "ordinal": i, "original_size": len(d), "metadata": {"target": t}}}
                   for i, (k, d, t) in enumerate(kernels)},
           "compression_scheme": "zstd-per-kernel", "zstd_offset": 64, "zstd_size": len(blob)}
    with open(work / "py.kpack", "wb") as f:
        f.write(struct.pack("<4sIQ", b"KPAK", 1, 0) + bytes(48))
        f.write(blob)
        toc_offset = f.tell()
        f.write(msgpack.packb(toc, use_bin_type=True))
        f.seek(8)
        f.write(struct.pack("<Q", toc_offset))


t_cli = median(cli)
t_api = median(api)
t_py = median(pure_python)

# Reading back: every kernel through kpack.Archive, against decompressing
# the same frames (already in memory) with zstandard.
path = work / "api.kpack"
raw = path.read_bytes()
n = struct.unpack_from("<I", raw, 64)[0]
frames, pos = [], 68
for _ in range(n):
    size = struct.unpack_from("<I", raw, pos)[0]
    frames.append(raw[pos + 4 : pos + 4 + size])
    pos += 4 + size


def read_archive():
    with kpack.Archive(path) as a:
        for key in a:
            a[key]


def decompress():
    d = zstandard.ZstdDecompressor()
    for f in frames:
        d.decompress(f)


t_read = median(read_archive)
t_dec = median(decompress)
same = (work / "api.kpack").read_bytes() == next((work / "packed" / ".kpack").glob("*.kpack")).read_bytes()
print(json.dumps({
    "code_objects": len(kernels), "bytes": total, "reps": reps,
    "cli_pack_tree_s": t_cli, "api_s": t_api, "pure_python_s": t_py,
    "api_over_cli": t_api / t_cli, "pure_python_over_api": t_py / t_api,
    "read_archive_s": t_read, "decompress_s": t_dec, "read_over_decompress": t_read / t_dec,
    "api_archive_equals_cli_archive": same,
}))
