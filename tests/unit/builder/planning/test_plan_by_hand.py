"""`mbuild plan qwen3-30b-a3b --gpu cpu` (and gpt-oss-20b, deepseek-v2-lite, deepseek-r1) print memory that can be
checked by hand from config.json's fields: here it is recomputed from profiles/catalog.yaml's fields with the
arithmetic docs/usage.md shows, none of the planner's code, and compared with what the user reads.

The host is the one docs/usage.md names (64 GB of RAM, AVX-512 VNNI; 1.5 TB for DeepSeek-R1's 671B), its RAM and
flags faked at their reader."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from builder.cli import cli
from builder.planning import target

ROOT = Path(__file__).resolve().parents[4]
VNNI = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"})
MXFP4 = 17 / 32  # bytes a weight: 32 four-bit values share an 8-bit exponent


def config_of(alias: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "profiles" / "catalog.yaml").read_text())["models"][alias]["config"]
    return config


def by_hand(config: dict[str, Any], batch: int, context: int, block: int, kv_value: int) -> dict[str, float]:
    """GB, as docs/usage.md's worked example computes them."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    experts = config.get("num_experts") or config.get("num_local_experts") or config["n_routed_experts"]
    routed = config["num_experts_per_tok"]
    width = config.get("moe_intermediate_size") or config["intermediate_size"]
    if config.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek-V3): q through a rank, k and v a latent
        rank, nope, rope = config["kv_lora_rank"], config["qk_nope_head_dim"], config["qk_rope_head_dim"]
        v = config["v_head_dim"]
        q_rank = config.get("q_lora_rank")  # V2-Lite's q is one matrix
        query = q_rank * (h + heads * (nope + rope)) if q_rank else h * heads * (nope + rope)
        attention = query + h * (rank + rope) + rank * heads * (nope + v) + heads * v * h
        kv_heads, head_dim, kinds = 1, rank + rope, 1  # the cache: the latent and the shared rotary key, held once
    else:
        kv_heads, head_dim, kinds = config["num_key_value_heads"], config["head_dim"], 2  # K and V
        attention = h * head_dim * (heads + kv_heads + kv_heads + heads)  # q, k, v, o
    expert = 3 * h * width  # gate, up, down
    dense = config.get("first_k_dense_replace", 0)  # DeepSeek's first layers: one MLP of intermediate_size
    shared = config.get("n_shared_experts", 0) * expert  # run by every token
    table = vocab * h  # the token table; the untied LM head is as large
    assert config["tie_word_embeddings"] is False
    common = layers * attention + dense * 3 * h * config["intermediate_size"] + 2 * table
    total = common + (layers - dense) * (experts * expert + h * experts + shared)  # h x experts: the router
    active = common + (layers - dense) * (routed * expert + h * experts + shared)
    int8 = 1 + 4 / block  # a byte a weight, an fp32 scale a block
    weights = (total - table) * int8 + table * (1 + 4 / 32)  # the gathered table: int8 blocks of 32
    kv = kinds * layers * kv_heads * head_dim * kv_value * context * batch  # int8 (1 B), or fp32 (4 B)
    method = str((config.get("quantization_config") or {}).get("quant_method") or "")
    download = {"mxfp4": (total - layers * experts * expert) * 2 + layers * experts * expert * MXFP4,
                "fp8": (total - 2 * table) + 2 * table * 2}.get(method, total * 2)  # FP8: all but the tables
    return {"params": total / 1e9, "active": active / 1e9, "weights": weights / 1e9, "kv": kv / 1e9,
            "need": (weights + kv) / 1e9 + 1.0, "read": (active - table) * int8 / 1e9,  # 1.0: the CPU headroom
            "download": download / 1e9, "kv_token": kinds * layers * kv_heads * head_dim * kv_value}


@pytest.mark.parametrize(("alias", "ram_gb"), [("qwen3-30b-a3b", 64.0), ("gpt-oss-20b", 64.0),
                                               ("deepseek-v2-lite", 64.0), ("deepseek-r1", 1536.0)])
def test_the_plans_memory_is_what_the_config_gives_by_hand(alias: str, ram_gb: float,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target, "read_ram_gb", lambda: ram_gb)
    monkeypatch.setattr(target, "read_cpu_flags", lambda: VNNI)
    printed = CliRunner().invoke(cli, ["plan", alias, "--gpu", "cpu"])
    assert printed.exit_code == 0, printed.output
    plan = json.loads(CliRunner().invoke(cli, ["plan", alias, "--gpu", "cpu", "--json"]).output)
    profile = plan["profile"]["content"]
    assert plan["profile"]["name"] == "onnxruntime-cpu.vnni-int8-tp1-throughput"
    assert profile["engine_options"]["kv_cache"] == "int8"  # a quantized CPU profile keeps an int8 KV cache
    want = by_hand(config_of(alias), profile["limits"]["max_batch"], profile["limits"]["context"],
                   profile["engine_options"]["block_size"], 1)
    memory = plan["memory"]
    assert memory["weights_gb"] == pytest.approx(want["weights"], abs=0.01)
    assert memory["kv_cache_gb"] == pytest.approx(want["kv"], abs=0.01)
    assert memory["decode_read_gb"] == pytest.approx(want["read"], abs=0.01)
    assert plan["requires"]["memory_gb"] == math.ceil(want["need"] * 10) / 10
    text = printed.output
    assert f"{want['params']:.3g}B parameters ({want['active']:.3g}B active)" in text
    assert (f"memory     {math.ceil(want['need'] * 10) / 10:g} GB of RAM: weights {want['weights']:.2f} + KV cache "
            f"{want['kv']:.2f} + headroom 1.00 = {want['need']:.2f}, rounded up") in text
    assert f"a decode step reads {want['read']:.2f} GB" in text
    assert re.search(rf"KV cache: {want['kv_token']} B a token .* x {profile['limits']['context']} tokens x "
                     rf"{profile['limits']['max_batch']} sequences", text)
    assert f"download {want['download']:.2f} GB" in text
