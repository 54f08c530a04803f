"""A pre-quantized checkpoint's weights read back to fp32, a block of rows at a time (checkpoint.py asks).

Each format of builder/model/quantization.py becomes views: a weight by the name the model's module has (its
`.weight`, or gpt-oss's fused `gate_up_proj`), with the shape the module holds it in, whose rows are decoded from
the stored tensors when asked. So the export, the gate's reference and the plan read the same weights, and build
memory follows the block asked for: a GPTQ or AWQ weight's columns are read from its packed rows band by band.

Every format is one of two grids:
- floating: FP8 codes (ml_dtypes decodes E4M3/E5M2) times a scale per block of [rows, columns]; DeepSeek's
  128x128 `weight_scale_inv`, a channel's or the tensor's `weight_scale` are blocks of other sizes; MXFP4
  (mxfp4.py) is E2M1 codes with a power-of-two scale per 32;
- integer: (q - zero) * scale, the group of a column from g_idx (GPTQ's act-order) or its index over the group
  size, q and zero unpacked from int32 words: GPTQ packs q along the input, zeros along the output; AWQ both along
  the output in its interleaved order; compressed-tensors along the input, offset to unsigned.
transformers dequantizes only some of these (FP8, MXFP4), and a whole tensor at once; so the reading is here.
"""

from __future__ import annotations

from builder.engine.dequant.floats import FLOAT8, float8_view, mxfp4_view
from builder.engine.dequant.integers import awq_view, gptq_view, integer_view, packed_view, unpack
from builder.engine.dequant.parts import Grid, Stored, View
from builder.model.quantization import AWQ, GPTQ, MXFP4, SourceFormat


def views(stored: Stored, names: list[str], fmt: SourceFormat) -> dict[str, View]:
    """Every quantized weight of the checkpoint, by the module's name for it."""
    found: dict[str, View] = {}
    for name in names:
        made = _view(stored, name, fmt)
        if made is not None:
            found[made[0]] = made[1]
    return found


def _view(stored: Stored, name: str, fmt: SourceFormat) -> tuple[str, View] | None:
    stem, _, leaf = name.rpartition(".")
    if fmt.method == MXFP4 and name.endswith("_blocks") and f"{name[:-7]}_scales" in stored:
        return name[:-7], mxfp4_view(stored, name[:-7])
    if stored.dtype(name) in FLOAT8:
        scale = next((f"{name}{s}" for s in ("_scale_inv", "_scale") if f"{name}{s}" in stored), None)
        return name, float8_view(stored, name, scale)
    if leaf == "qweight" and fmt.method in (GPTQ, AWQ):
        return f"{stem}.weight", (gptq_view if fmt.method == GPTQ else awq_view)(stored, stem, fmt)
    if leaf == "weight_packed":
        return f"{stem}.weight", packed_view(stored, stem, fmt)
    if leaf == "weight" and stored.dtype(name) == "I8" and f"{name}_scale" in stored:  # int-quantized
        return name, integer_view(stored, stem, fmt)
    return None


__all__ = ["Grid", "Stored", "View", "unpack", "views"]
