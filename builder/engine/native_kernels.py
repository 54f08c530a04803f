"""mbuild's own ONNX Runtime kernels (runtimes/kernels/*.cpp), compiled for the build target into a custom-op library.

A custom-op library is compiled against ONNX Runtime's C API header, which the onnxruntime wheel does not ship. It
comes from Debian's libonnxruntime-dev package (fetched once, its digest pinned and checked, only its headers
kept): the C API is versioned, so a library built on API 21's header loads in any later ONNX Runtime. The library
is cached by the digest of its sources (and the headers they include), flags and ONNX Runtime's header, so each
machine compiles it once.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import urllib.request
from pathlib import Path

from builder.errors import ToolMissing
from builder.resources import mbuild_cache_dir
from builder.settings import host_settings
from runtimes.kernels import KERNEL_HEADERS, KERNEL_SOURCES, LIBRARY_FILE

HEADERS_URL = ("https://deb.debian.org/debian/pool/main/o/onnxruntime/"
               "libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb")
HEADERS_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
HEADERS_PREFIX = "./usr/include/onnxruntime/"
HEADERS_MAX_BYTES = 64 << 20  # the package is ~0.1 MB; anything near this is not it
# AVX-512 with VNNI: the instructions the kernels use; the library refuses to register on a CPU without them.
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-mavx512f", "-mavx512bw", "-mavx512vl",
         "-mavx512dq", "-mavx512vnni", "-mfma",
         "-static-libstdc++", "-static-libgcc")  # the image's C++ runtime may be older than this host's


def _debian_members(deb: bytes) -> dict[str, bytes]:
    """The members of a .deb (an ar archive): name -> bytes. Written here since the stdlib reads tar but not ar."""
    if not deb.startswith(b"!<arch>\n"):
        raise ToolMissing("the ONNX Runtime headers package is not a Debian archive")
    members, at = {}, 8
    while at + 60 <= len(deb):
        name, size = deb[at:at + 16].decode().strip().rstrip("/"), int(deb[at + 48:at + 58].decode().strip())
        members[name] = deb[at + 60:at + 60 + size]
        at += 60 + size + (size % 2)
    return members


def _headers(cache: Path) -> Path:
    """ONNX Runtime's C/C++ API headers, fetched and checked once into the cache."""
    include = cache / f"onnxruntime-headers-{HEADERS_SHA256[:16]}"
    if (include / "onnxruntime_c_api.h").is_file():
        return include
    try:
        with urllib.request.urlopen(HEADERS_URL, timeout=60) as response:
            deb = response.read(HEADERS_MAX_BYTES + 1)
    except OSError as exc:
        raise ToolMissing(f"cannot fetch ONNX Runtime's C API headers from {HEADERS_URL}: {exc}",
                          hint="allow access to deb.debian.org, or set engine_options.quantization: blocks") from exc
    if hashlib.sha256(deb).hexdigest() != HEADERS_SHA256:
        raise ToolMissing(f"{HEADERS_URL} does not have the pinned digest {HEADERS_SHA256}")
    data = next((v for k, v in _debian_members(deb).items() if k.startswith("data.tar")), None)
    if data is None:
        raise ToolMissing("the ONNX Runtime headers package has no data archive")
    staging = include.with_name(include.name + f".{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            name = member.name[len(HEADERS_PREFIX):]
            # Only plain header files straight under the prefix: no links, no folders, no ".." to leave it.
            if member.isfile() and member.name.startswith(HEADERS_PREFIX) and name.endswith(".h") and "/" not in name:
                source = archive.extractfile(member)
                if source is not None:
                    (staging / name).write_bytes(source.read())
    if include.exists():  # another build fetched them meanwhile
        shutil.rmtree(staging)
    else:
        os.replace(staging, include)
    return include


def build_library(cache: Path | None = None) -> Path:
    """The custom-op library of every kernel in runtimes/kernels, compiled here once and cached."""
    cache = cache or mbuild_cache_dir() / "kernels"
    compiler = host_settings().cxx or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise ToolMissing("mbuild's int8 kernel needs a C++ compiler (g++) to build",
                          hint="install g++ (apt-get install g++), or set engine_options.quantization: blocks")
    digest = hashlib.sha256(repr((FLAGS, HEADERS_SHA256)).encode())
    for source in (*KERNEL_SOURCES, *KERNEL_HEADERS):
        digest.update(source.read_bytes())
    library = cache / digest.hexdigest()[:16] / LIBRARY_FILE
    if library.is_file():
        return library
    include = _headers(cache)
    library.parent.mkdir(parents=True, exist_ok=True)
    partial = library.with_name(f"{LIBRARY_FILE}.{os.getpid()}")
    try:
        done = subprocess.run([compiler, *FLAGS, f"-I{include}", *map(str, KERNEL_SOURCES), "-o", str(partial)],
                              capture_output=True, text=True, check=False)
    except OSError as exc:  # CXX names no program
        raise ToolMissing(f"cannot run the C++ compiler {compiler}: {exc}", hint="set CXX to g++'s path") from exc
    if done.returncode != 0:
        raise ToolMissing(f"compiling mbuild's int8 kernel failed ({compiler}):\n{done.stderr[-2000:]}",
                          hint="set engine_options.quantization: blocks to use ONNX Runtime's MatMulNBits")
    os.replace(partial, library)
    return library
