"""mbuild's own ONNX Runtime kernels, C++ sources compiled by the builder (builder/engine/native_kernels.py) into one
custom-op library that an engine carries; each source's opening comment says what ONNX Runtime lacked."""

from __future__ import annotations

from pathlib import Path

KERNEL_SOURCES = tuple(Path(__file__).with_name(f"{name}.cpp") for name in ("int8_tiles", "attention", "experts"))
# included by the sources: part of the digest
KERNEL_HEADERS = (Path(__file__).with_name("attention_simd.h"), Path(__file__).with_name("int8_tiles.h"))
LIBRARY_FILE = "libmbuild_kernels.so"  # its name inside a model folder
DOMAIN = "ai.mbuild"
# CausalAttention (attention.cpp): GroupQueryAttention's inputs and numbers for an in-place cache, fp32 or int8 (the
# int8 form takes k_scale and v_scale after its other inputs), for these head sizes; where a model needs more
# (a window, a soft cap, sinks), the graph keeps GroupQueryAttention
ATTENTION_OP, ATTENTION_INT8_OP, ATTENTION_INPUTS = "CausalAttention", "CausalAttentionInt8Cache", 9
ATTENTION_HEAD_DIMS = (16, 32, 64, 128)
# ExpertsInt8Tiles (experts.cpp): QMoE's inputs and numbers for int8 experts in MatMulInt8Tiles' layout
EXPERTS_OP = "ExpertsInt8Tiles"
# A session option entry that keeps MatMulInt8Tiles off AMX's tiles (on VNNI) when set before the library registers;
# int8_tiles.cpp reads it by this name
NO_AMX_ENTRY = "mbuild.no_amx"
# MatMulInt8Tiles' layout (int8_tiles.cpp says it): blocks of 128 k, columns in groups of 64
TILE_BLOCK, TILE_GROUP = 128, 64
