"""Mixture-of-experts feed-forward blocks (Mixtral, Qwen3-MoE, gpt-oss) as ONNX Runtime's MoE and QMoE contrib ops.

A block is an fp32 router (a MatMul, plus gpt-oss's bias; kept fp32 in every profile: it is tiny and a rounded
logit can pick another expert) and one MoE node (fp32 profile) or QMoE node (int8, n-bit), which route,
run the chosen experts and mix them. The experts are streamed from the checkpoint into the external-data file
a block of rows at a time (one expert at most), so the build holds one expert, never the layer.

What ONNX Runtime 1.32's CPU kernels accept, measured (tests/unit/builder/engine/test_decoder_moe.py checks the
outcome):
- router_probs are the router's logits [tokens, E]: the kernel takes softmax over all E, then the top k, then
  renormalises them when normalize_routing_weights=1. gpt-oss's softmax over its top-k logits is the same.
- MoE (fp32) runs only SwiGLU with gate and up fused and interleaved (swiglu_fusion=1): a separate fc3 is
  "not implemented for CPU MoE" and fusions 0 and 2 are refused. So every family is written as fc1
  [E, 2I, H] with rows gate0, up0, gate1, ... (nn.Linear orientation, not x @ W) and fc2 [E, H, I]; SiLU
  gating is swiglu with alpha 1, beta 0 and no limit. The input may stay 3-D [B, S, H]; the router's
  logits must be 2-D.
- QMoE weights are [E, N, K * bits / 8] uint8, each expert's rows as MatMulNBits packs them
  (weights_prepacked=0, set explicitly: the default -1 lets an execution provider expect its own layout),
  scales [E, N, K / block] or [E, N] per channel, and no zero points: the default 2^(bits-1) is the offset
  of the symmetric packing. Block-wise scales need H and I divisible by a power-of-two block (16 to 256).
- Block-wise 8-bit experts quantize the activations to int8 on CPU (output 1.2% off, relative L2, from their
  own dequantized weights'; 4-bit blocks and per-channel 8-bit: 1e-7), and are the fast ones. One step of 8
  experts, H = I = 1024, top 2, one thread (best of 5 x 10 runs on a shared host): 1 token 0.45 ms in 8-bit
  blocks, 0.72 in 4-bit blocks, 4.0 in fp32 MoE, 9.8 per channel (a dense fp32 MLP with two experts'
  parameters: 5.1); 16 tokens 6.5, 14.5, 53 and 68 ms.
What is written here rather than taken from ONNX Runtime: the per-channel 8-bit rows, used only where no
block fits (its packing kernel takes only power-of-two blocks; these use the int8 profile's own scales and
rounding, shifted by 128), and the interleaving of gate and up rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from builder.engine import int8_tiles, mxfp4
from builder.engine.checkpoint import Checkpoint
from builder.engine.decoder_graph import GraphWriter
from builder.engine.weight_writer import BLOCK_BYTES, LinearFormat, LinearWriter, int8_rows, int8_scales, pack_rows
from builder.errors import UnsupportedModel
from builder.model.families import family
from runtimes.kernels import DOMAIN as KERNELS_DOMAIN
from runtimes.kernels import EXPERTS_OP

Rows = Iterator[tuple[int, np.ndarray]]  # (first row, fp32 rows [n, K]) of one expert's projection
BLOCKS = (256, 128, 64, 32, 16)  # the block sizes ONNX Runtime's packing kernels take
SILU_GATE = {"activation_alpha": 1.0, "activation_beta": 0.0}  # swiglu as silu(gate) * up


@dataclass(frozen=True)
class Experts:
    """A layer's experts as its family stores them, read as MoE wants them: fc1 rows [2I, H] with gate and up
    interleaved, fc2 rows [H, I]; plus the routing and activation attributes."""

    checkpoint: Checkpoint
    prefix: str
    router: str
    count: int
    hidden: int
    inter: int
    layout: str  # split: a tensor per expert and projection | fused: gpt-oss [E, H, 2I] | mxfp4
    names: tuple[str, ...]
    attributes: dict[str, Any]

    def fc1(self, e: int) -> Rows:
        ck, h, i = self.checkpoint, self.hidden, self.inter
        if self.layout == "split":
            gate, up = (n.format(e=e) for n in self.names[:2])
            for (first, g), (_, u) in zip(ck.blocks([gate], BLOCK_BYTES // 2), ck.blocks([up], BLOCK_BYTES // 2),
                                          strict=True):
                rows = np.empty((2 * len(g), h), np.float32)
                rows[0::2], rows[1::2] = g, u
                yield 2 * first, rows
        elif self.layout == "fused":  # gpt-oss stores x @ W, interleaved already: one transpose per expert
            yield 0, ck.rows(self.names[0], e, e + 1)[0].T
        else:
            yield 0, mxfp4.expert_rows(ck, self.names[0], e, 2 * i, h)

    def fc2(self, e: int) -> Rows:
        ck, h, i = self.checkpoint, self.hidden, self.inter
        if self.layout == "split":
            yield from ck.blocks([self.names[2].format(e=e)], BLOCK_BYTES)
        elif self.layout == "fused":
            yield 0, ck.rows(self.names[1], e, e + 1)[0].T
        else:
            yield 0, mxfp4.expert_rows(ck, self.names[1], e, h, i)

    def expect(self, name: str, shape: tuple[int, ...]) -> None:
        found = self.checkpoint.shape(name)
        if found != shape:
            raise UnsupportedModel(f"tensor {name!r} is {list(found)}; the config implies {list(shape)}",
                                   hint="is config.json the one this checkpoint was saved with?")


def experts(checkpoint: Checkpoint, config: Any, layer: int) -> Experts:
    """Where the layer's experts are and how they are routed and activated, as the family's record says (its
    Experts); checked against the config."""
    kind = config.model_type
    layout = family(kind).experts
    if layout is None:
        raise UnsupportedModel(f"{kind!r} has no mixture-of-experts block mbuild writes")
    if layout.gating == "silu" and getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"expert activation {config.hidden_act!r} is not supported (silu is)")
    h = int(config.hidden_size)
    k = int(config.num_experts_per_tok)
    prefix = f"model.layers.{layer}.{layout.block}"
    count, i = int(getattr(config, layout.count_field)), int(getattr(config, layout.inter_field))
    names = tuple(f"{prefix}.{w}" for w in layout.weights)
    normalize = int(bool(getattr(config, layout.normalize_field))) if layout.normalize_field else 1
    swiglu = {"activation_type": "swiglu", "swiglu_fusion": 1, "k": k}
    gating: dict[str, Any] = dict(SILU_GATE)
    if layout.gating == "clamped_swiglu":  # (up + 1) * gate * sigmoid(alpha * gate), both clamped: swiglu's beta 1
        gating = {"activation_alpha": float(config.swiglu_alpha), "activation_beta": 1.0}
        if getattr(config, "swiglu_limit", None) is not None:
            gating["swiglu_limit"] = float(config.swiglu_limit)
    form = "split" if not layout.fused else "mxfp4" if f"{names[0]}_blocks" in checkpoint else "fused"
    found = Experts(checkpoint, prefix, f"{prefix}.{layout.router}", count, h, i, form, names,
                    {**swiglu, **gating, "normalize_routing_weights": normalize})
    if not 0 < k <= count:
        raise UnsupportedModel(f"{kind} layer {layer} routes each token to {k} of {count} experts")
    found.expect(f"{found.router}.weight", (count, h))
    # every shape before the first byte is written: a mismatch is found in seconds, not after a layer's experts
    checks: list[tuple[str, tuple[int, ...]]] = []
    if found.layout == "split":
        checks = [(n.format(e=e), shape) for e in range(count)
                  for n, shape in zip(names, ((i, h), (i, h), (h, i)), strict=True)]
    elif found.layout == "fused":  # (MXFP4's shapes are checked as each expert is read)
        checks = list(zip(names, ((count, h, 2 * i), (count, i, h)), strict=True))
    for name, shape in checks:
        found.expect(name, shape)
    return found


@dataclass(frozen=True)
class Scheme:
    """How expert weights are stored: fp32 (bits None), or symmetric `bits`-bit integers in blocks of `block`
    along K, or with one scale per row (block None: 8-bit only, where no block fits)."""

    bits: int | None = None
    block: int | None = None
    tiles: bool = False  # 8-bit blocks of 128 in MatMulInt8Tiles' layout, run by mbuild's ExpertsInt8Tiles

    @classmethod
    def of(cls, form: LinearFormat, hidden: int, inter: int) -> Scheme:
        """int8 profiles get 8-bit blocks of up to form.block_size too: per-channel 8-bit experts run 5-10x slower
        on CPU (measured), for 1.1% error against blocks' 1.6%; the profile's per_channel and reduce_range are
        its linear layers' choices, blocks are finer than either."""
        if form.kind == "fp32":
            return cls()
        if form.tiles:  # its blocks of 128 need no divisor: K is padded to whole blocks, as a linear layer's is
            return cls(8, int8_tiles.BLOCK, tiles=True)
        bits = 8 if form.kind == "int8" else form.bits
        if bits not in (4, 8):
            raise UnsupportedModel(f"{bits}-bit experts are not supported (4 and 8 are)")
        # QMoE needs H and I whole blocks: the largest packable block up to the profile's that divides both
        fits = [b for b in BLOCKS if b <= form.block_size and hidden % b == 0 and inter % b == 0]
        if fits or bits == 8:
            return cls(bits, fits[0] if fits else None)
        raise UnsupportedModel(f"expert sizes {hidden} and {inter} are not multiples of a {min(BLOCKS)}-wide block, "
                               f"which {bits}-bit experts need", hint="use an fp32 or int8 profile")


class ProjectionWriter:
    """One projection of every expert, [E, N, K] in a Scheme, written a block of rows at a time."""

    def __init__(self, g: GraphWriter, name: str, shape: tuple[int, int, int], scheme: Scheme) -> None:
        self.g, self.scheme = g, scheme
        experts, self.n, self.k = shape
        if scheme.bits is None:
            self.width = 4 * self.k
            self.names = [f"{name}.weight"]
            self.offset = g.weights.reserve(self.names[0], shape, np.dtype(np.float32))
            return
        if scheme.tiles:
            groups, blocks = -(-self.n // int8_tiles.GROUP), -(-self.k // int8_tiles.BLOCK)
            self.names = [f"{name}.weight_tiles", f"{name}.weight_tile_scales"]
            self.offset = g.weights.reserve(self.names[0], (experts, groups, blocks, int8_tiles.QUADS,
                                                            int8_tiles.GROUP, 4), np.dtype(np.uint8))
            self.scales = g.weights.reserve(self.names[1], (experts, groups, blocks, int8_tiles.GROUP),
                                            np.dtype(np.float32))
            self.width = groups * blocks * int8_tiles.BLOCK * int8_tiles.GROUP  # an expert's bytes of each
            self.scale_width = 4 * groups * blocks * int8_tiles.GROUP
            return
        self.width = self.k * scheme.bits // 8
        scales = self.k // scheme.block if scheme.block else 1
        self.names = [f"{name}.weight_q{scheme.bits}", f"{name}.scales"]
        self.offset = g.weights.reserve(self.names[0], (experts, self.n, self.width), np.dtype(np.uint8))
        scale_shape = (experts, self.n, scales) if scheme.block else (experts, self.n)
        self.scales = g.weights.reserve(self.names[1], scale_shape, np.dtype(np.float32))
        self.scale_width = 4 * scales

    def write(self, expert: int, rows: Rows) -> None:
        if self.scheme.tiles:  # the layout groups 64 whole rows: the expert's rows at once (one expert in memory)
            tiles, scales = int8_tiles.tile_weights(*pack_rows(np.concatenate([r for _, r in rows]), 8,
                                                               int8_tiles.BLOCK))
            self.g.weights.put(self.offset + expert * self.width, tiles)
            self.g.weights.put(self.scales + expert * self.scale_width, scales)
            return
        for first, block in rows:
            at = expert * self.n + first
            if self.scheme.bits is None:
                self.g.weights.put(self.offset + at * self.width, block)
                continue
            if self.scheme.block:
                packed, scales = pack_rows(block, self.scheme.bits, self.scheme.block)
            else:  # symmetric int8 rounded as the int8 profile's linear layers are, offset by QMoE's zero point 128
                scales = int8_scales(np.abs(block).max(axis=1), reduce_range=False)
                packed = (int8_rows(block, scales.reshape(-1, 1)).astype(np.int16) + 128).astype(np.uint8)
            self.g.weights.put(self.offset + at * self.width, packed)
            self.g.weights.put(self.scales + at * self.scale_width, scales.astype(np.float32))


def moe_block(g: GraphWriter, config: Any, layer: int, x: str) -> str:
    """The feed-forward block of a layer with experts (decoder_family.sparse_layer;
    the others are dense MLPs): x, the normalised hidden state [batch, seq, hidden] fp32, in; the block's output
    (same shape, before the residual add) out."""
    found = experts(g.checkpoint, config, layer)
    name = f"layers.{layer}.moe"
    op, weights, _ = LinearWriter(g.weights, g.checkpoint, LinearFormat())([f"{found.router}.weight"],
                                                                             f"layers.{layer}.router")
    logits = g.node(op, [x, *weights], f"layers.{layer}.router")[0]
    if f"{found.router}.bias" in g.checkpoint:
        bias = g.weights.add(f"layers.{layer}.router.bias", g.checkpoint.get(f"{found.router}.bias"))
        logits = g.node("Add", [logits, bias], f"layers.{layer}.router_bias")[0]
    shape = g.weights.add(f"layers.{layer}.router.shape", np.array([-1, found.count], np.int64))
    logits = g.node("Reshape", [logits, shape], f"layers.{layer}.router_rows")[0]  # MoE wants [tokens, E]
    scheme = Scheme.of(g.form, found.hidden, found.inter)
    biases = _biases(g, found, name)
    fc1 = ProjectionWriter(g, f"{name}.fc1", (found.count, 2 * found.inter, found.hidden), scheme)
    fc2 = ProjectionWriter(g, f"{name}.fc2", (found.count, found.hidden, found.inter), scheme)
    for e in range(found.count):
        fc1.write(e, found.fc1(e))
        fc2.write(e, found.fc2(e))
    return expert_node(g, name, [x, logits], (fc1, fc2), biases, found.attributes, found.inter)


def expert_node(g: GraphWriter, name: str, inputs: list[str], projections: tuple[ProjectionWriter, ProjectionWriter],
                biases: tuple[str, str], attributes: dict[str, Any], inter: int) -> str:
    """The node that routes and runs a layer's written experts, from x and the router's logits [tokens, E]: MoE
    (fp32), mbuild's ExpertsInt8Tiles (int8 tiles) or QMoE (other 8- and 4-bit blocks); its output."""
    fc1, fc2 = projections
    scheme = fc1.scheme
    if scheme.bits is None:
        return g.node("MoE", [*inputs, fc1.names[0], biases[0], fc2.names[0], biases[1]], name,
                      domain="com.microsoft", **attributes)[0]
    weights = [*inputs, *fc1.names, biases[0], *fc2.names, biases[1]]
    if scheme.tiles:  # swiglu with gate and up interleaved is all it runs: activation_type and fusion go unsaid
        kept = {k: v for k, v in attributes.items() if k not in ("activation_type", "swiglu_fusion")}
        return g.node(EXPERTS_OP, weights, name, domain=KERNELS_DOMAIN, inter=inter, **kept)[0]
    quantized: dict[str, Any] = {"expert_weight_bits": scheme.bits, "weights_prepacked": 0}
    if scheme.block:
        quantized["block_size"] = scheme.block
        if g.form.kind == "nbits" and g.form.accuracy_level:
            quantized["accuracy_level"] = g.form.accuracy_level
    return g.node("QMoE", weights, name, domain="com.microsoft", **attributes, **quantized)[0]


def _biases(g: GraphWriter, found: Experts, name: str) -> tuple[str, str]:
    """gpt-oss's expert biases, fc1 [E, 2I] (interleaved as its rows are) and fc2 [E, H]; "" for none."""
    if found.layout == "split":
        return "", ""
    out = []
    for part, source, width in (("fc1", "gate_up_proj_bias", 2 * found.inter), ("fc2", "down_proj_bias", found.hidden)):
        tensor = f"{found.prefix}.experts.{source}"
        found.expect(tensor, (found.count, width))
        out.append(g.weights.add(f"{name}.{part}.bias", g.checkpoint.get(tensor)))
    return out[0], out[1]
