"""Pre-quantized checkpoints written from a float one, byte for byte as each format's spec lays them out, for
issue 59's tests: GPTQ (v1 and v2 zero points, act-order g_idx), AWQ (GEMM packing), FP8 E4M3 with block scales
(DeepSeek's weight_scale_inv) and gpt-oss's MXFP4 experts. No library writes these offline here: GPTQ and AWQ are
made by quantizers that need a GPU, and transformers' FP8 and MXFP4 quantizers refuse a CPU (it only reads them).

Each writer returns the checkpoint and an fp32 one of the values the codes stand for, decoded by the spec here and
not by mbuild: what transformers runs as the dequantized source. The packing below is written from the formats'
descriptions (AutoGPTQ's and AutoAWQ's packers, DeepSeek-V3's and OCP MX's specs) independently of
builder/engine/dequant/, which reads them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
from safetensors.torch import load_file as load_torch
from safetensors.torch import save_file

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)  # OCP MX's FP4 magnitudes, codes 0-7
AWQ_PACK = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ packs column AWQ_PACK[j] of each 8 into nibble j
Tensors = dict[str, np.ndarray]


def _quantized(name: str, value: np.ndarray) -> bool:
    """The decoder layers' linear weights: what the formats quantize (embeddings, norms, the head stay)."""
    return value.ndim == 2 and ".layers." in name and name.endswith("proj.weight")


def _pack(values: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unsigned values packed into int32 words along `axis`, value i of a word at bits [i*bits, (i+1)*bits)."""
    per = 32 // bits
    moved = np.moveaxis(values.astype(np.uint32), axis, -1)
    grouped = moved.reshape(*moved.shape[:-1], -1, per)
    words = np.zeros(grouped.shape[:-1], np.uint32)
    for i in range(per):
        words |= grouped[..., i] << np.uint32(i * bits)
    return np.moveaxis(words.view(np.int32), -1, axis)


def _grid(weight: np.ndarray, bits: int, groups: np.ndarray, count: int, symmetric: bool = False
          ) -> tuple[np.ndarray, ...]:
    """Round-to-nearest of weight [N, K] with a scale and zero per (row, group), asymmetric or (GPTQ's sym) about
    a zero of 2^(b-1): q [N, K], zeros and scales [N, G] (fp16 scales, as the formats store them), and the values
    they stand for."""
    top = (1 << bits) - 1
    scales, zeros = np.zeros((weight.shape[0], count), np.float16), np.zeros((weight.shape[0], count), np.int64)
    for g in range(count):
        cols = weight[:, groups == g]
        lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
        if symmetric:
            lo, hi = -np.maximum(-lo, hi), np.maximum(-lo, hi)
        scales[:, g] = np.maximum((hi - lo) / top, 1e-6).astype(np.float16)
        zeros[:, g] = (top + 1) // 2 if symmetric else np.clip(np.round(-lo / scales[:, g].astype(np.float32)), 0, top)
    s, z = scales.astype(np.float32)[:, groups], zeros[:, groups]
    q = np.clip(np.round(weight / s) + z, 0, top).astype(np.int64)
    return q, zeros, scales, ((q - z) * s).astype(np.float32)


def gptq(name: str, weight: np.ndarray, bits: int, group: int, act_order: bool, v2: bool) -> tuple[Tensors, np.ndarray]:
    """AutoGPTQ's layout: qweight [K*b/32, N] packed along the input, qzeros [G, N*b/32] along the output (v1
    stores each zero minus one), scales [G, N] fp16, g_idx [K] (a permutation's groups under act-order)."""
    n, k = weight.shape
    count = k // group
    order = np.random.default_rng(k + n).permutation(k) if act_order else np.arange(k)
    groups = np.empty(k, np.int32)
    groups[order] = np.arange(k) // group  # the i-th column quantized, in act-order, is in group i // group
    # v1 checkpoints are symmetric (AutoGPTQ's sym=True): an asymmetric zero of 0 would be stored as -1
    q, zeros, scales, values = _grid(weight, bits, groups, count, symmetric=not v2)
    stem = name.removesuffix(".weight")
    stored = zeros - (0 if v2 else 1)
    return {f"{stem}.qweight": _pack(q.T, bits, 0), f"{stem}.qzeros": _pack(stored.T & ((1 << bits) - 1), bits, 1),
            f"{stem}.scales": np.ascontiguousarray(scales.T), f"{stem}.g_idx": groups}, values


def awq(name: str, weight: np.ndarray, group: int) -> tuple[Tensors, np.ndarray]:
    """AutoAWQ's GEMM layout: qweight [K, N/8] and qzeros [K/g, N/8], 8 columns a word in AWQ_PACK order,
    scales [K/g, N] fp16."""
    k = weight.shape[1]
    groups = (np.arange(k) // group).astype(np.int32)
    q, zeros, scales, values = _grid(weight, 4, groups, k // group)

    def packed(columns: np.ndarray) -> np.ndarray:  # [R, N] -> [R, N/8], nibble j of word c = column 8c+AWQ_PACK[j]
        shaped = columns.reshape(columns.shape[0], -1, 8)[..., AWQ_PACK]
        return _pack(shaped.reshape(columns.shape), 4, 1)
    stem = name.removesuffix(".weight")
    return {f"{stem}.qweight": packed(q.T), f"{stem}.qzeros": packed(zeros.T),
            f"{stem}.scales": np.ascontiguousarray(scales.T)}, values


def fp8_blocks(name: str, weight: np.ndarray, block: int, e8m0: bool = False) -> tuple[Tensors, np.ndarray]:
    """DeepSeek-V3's layout: weight E4M3 [N, K], weight_scale_inv fp32 [ceil(N/b), ceil(K/b)], each block scaled
    so its largest magnitude is E4M3's largest (448); experts stacked [E, N, K] (transformers' FP8 experts) with
    a scale of those each, [E, ceil(N/b), ceil(K/b)]. e8m0: the scales powers of two stored as E8M0 (UE8M0, as
    DeepSeek-V3.2 ships them), each the next one up from absmax/448."""
    if weight.ndim == 3:
        each = [fp8_blocks(name, expert, block, e8m0) for expert in weight]
        stacked = {key: np.stack([parts[key] for parts, _ in each]) for key in each[0][0]}
        return stacked, np.stack([values for _, values in each])
    n, k = weight.shape
    rows, cols = -(-n // block), -(-k // block)
    scale = np.ones((rows, cols), np.float32)
    codes = np.empty((n, k), ml_dtypes.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            part = weight[i * block:(i + 1) * block, j * block:(j + 1) * block]
            scale[i, j] = max(float(np.abs(part).max()), 1e-12) / 448.0
            if e8m0:
                scale[i, j] = 2.0 ** np.ceil(np.log2(scale[i, j]))
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = (part / scale[i, j]).astype(
                ml_dtypes.float8_e4m3fn)
    spread = np.repeat(np.repeat(scale, block, 0), block, 1)[:n, :k]
    stored = (np.log2(scale).astype(np.int32) + 127).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu) if e8m0 else scale
    return {name: codes, f"{name}_scale_inv": stored}, (codes.astype(np.float32) * spread).astype(np.float32)


def mxfp4(name: str, weight: np.ndarray) -> tuple[Tensors, np.ndarray]:
    """gpt-oss's experts as OpenAI publishes them: weight [E, K, N] (x @ W) stored out-major as {name}_blocks
    [E, N, K/32, 16] (E2M1 codes, element 2j in the low nibble) and {name}_scales [E, N, K/32] (E8M0: 2^(s-127)),
    each block's exponent chosen so its largest magnitude fits E2M1's 6."""
    rows = np.ascontiguousarray(weight.transpose(0, 2, 1))
    blocks = rows.reshape(*rows.shape[:-1], -1, 32)
    exponent = np.floor(np.log2(np.maximum(np.abs(blocks).max(-1, keepdims=True), 1e-30))) - 2  # 6 = 1.5 * 2^2
    scaled = blocks / 2.0 ** exponent
    index = np.abs(np.abs(scaled)[..., None] - E2M1).argmin(-1)  # the nearest magnitude on the grid
    codes = (index + 8 * (scaled < 0)).astype(np.uint8)
    values = (np.where(scaled < 0, -1, 1) * E2M1[index] * 2.0 ** exponent).reshape(rows.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return ({f"{name}_blocks": packed, f"{name}_scales": (exponent[..., 0] + 127).astype(np.uint8)},
            values.transpose(0, 2, 1).astype(np.float32))


def linear_and_experts(name: str, value: np.ndarray) -> bool:
    """The linear weights and the fused experts (FP8 MoE checkpoints quantize both)."""
    return _quantized(name, value) or (value.ndim == 3 and ".experts." in name)


def experts(name: str, value: np.ndarray) -> bool:
    """gpt-oss's fused expert weights: what its MXFP4 checkpoints quantize."""
    return value.ndim == 3 and name.endswith(("experts.gate_up_proj", "experts.down_proj"))


def write(source: Path, out: Path, quantization: dict[str, object],
          quantize: Callable[[str, np.ndarray], tuple[Tensors, np.ndarray]],
          takes: Callable[[str, np.ndarray], bool] = _quantized, twin: bool = True) -> Path:
    """`source` (a float checkpoint, in one file or shards) re-written to `out` as one file with the weights `takes`
    picks (the linear ones) quantized, and the dequantized twin at `out`-dequantized; the config names
    `quantization`."""
    tensors = _float32(source)
    stored: Tensors = {}
    decoded: Tensors = {}
    for name, value in tensors.items():
        if takes(name, value):
            parts, decoded[name] = quantize(name, value)
            stored.update(parts)
        else:
            stored[name] = decoded[name] = value
    twins = [(out.with_name(out.name + "-dequantized"), decoded, False)] if twin else []
    for folder, weights, quantized in ((out, stored, True), *twins):
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
        save_file({k: _torch(v) for k, v in weights.items()}, str(folder / "model.safetensors"))
        config = json.loads((folder / "config.json").read_text())
        if quantized:
            config["quantization_config"] = quantization
        (folder / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _float32(source: Path) -> Tensors:
    """Every tensor of a checkpoint's safetensors files, floats as fp32 numpy (bf16 included, which numpy lacks)."""
    tensors: Tensors = {}
    for path in sorted(source.glob("*.safetensors")):
        for name, value in load_torch(str(path)).items():
            tensors[name] = (value.float() if value.is_floating_point() else value).numpy()
    return tensors


def _torch(value: np.ndarray) -> torch.Tensor:
    """safetensors' numpy writer has no FP8: E4M3 codes and E8M0 scales go through torch's float8 dtypes."""
    kinds = ((ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn), (ml_dtypes.float8_e8m0fnu, torch.float8_e8m0fnu))
    for kind, theirs in kinds:
        if value.dtype == kind:
            return torch.from_numpy(np.ascontiguousarray(value).view(np.uint8)).view(theirs)
    return torch.from_numpy(np.ascontiguousarray(value))


def compressed(source: Path, out: Path, fmt: str, bits: int, symmetric: bool, group: int) -> Path:
    """`source` compressed by the compressed-tensors library itself, as llm-compressor saves a model: every Linear
    but the head quantized (per channel; per group of `group` columns; group -1: one scale for the tensor), its
    scales the library's own calculate_qparams from each row's, group's or tensor's range, then compressed to `fmt`
    and saved with its config."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    args = QuantizationArgs(num_bits=bits, symmetric=symmetric, type="float" if fmt == "float-quantized" else "int",
                            strategy="group" if group > 0 else "tensor" if group < 0 else "channel",
                            group_size=group if group > 0 else None)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        params = dict(module.named_parameters(recurse=False))
        if "weight_scale" in params:
            weight = params["weight"].data
            ranged = (weight.reshape(weight.shape[0], -1, group) if group > 0 else weight.reshape(1, 1, -1)
                      if group < 0 else weight.unsqueeze(1))
            scale, zero = calculate_qparams(ranged.amin(-1), ranged.amax(-1), args)
            params["weight_scale"].data.copy_(scale.reshape(params["weight_scale"].shape))
            if "weight_zero_point" in params:
                params["weight_zero_point"].data.copy_(zero.reshape(params["weight_zero_point"].shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    for tokenizer in source.glob("tokenizer*"):
        shutil.copy(tokenizer, out)
    _decompressed_twin(source, out)
    return out


def _decompressed_twin(source: Path, out: Path) -> None:
    """`out`-dequantized: the weights transformers loads from `out` with compressed-tensors decompressing them."""
    import warnings

    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    with warnings.catch_warnings():  # "You passed quantization_config": run_compressed=False is the point
        warnings.simplefilter("ignore", UserWarning)
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                     quantization_config=CompressedTensorsConfig(run_compressed=False))
    stored = set(_float32(source))
    twin = out.with_name(out.name + "-dequantized")
    shutil.copytree(source, twin)
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k in stored}
    save_file(weights, str(twin / "model.safetensors"))
