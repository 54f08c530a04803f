"""mbuild's own ONNX Runtime kernels, C++ sources compiled by the builder (builder/engine/native_kernels.py) into one
custom-op library that an engine carries; each source's opening comment says what ONNX Runtime lacked."""

from __future__ import annotations

from pathlib import Path

KERNEL_SOURCES = (Path(__file__).with_name("int8_tiles.cpp"),)
LIBRARY_FILE = "libmbuild_kernels.so"  # its name inside a model folder
DOMAIN = "ai.mbuild"
# MatMulInt8Tiles' layout (int8_tiles.cpp says it): blocks of 128 k, columns in groups of 64
TILE_BLOCK, TILE_GROUP = 128, 64
