"""The peer comparisons' shapes (bench/lib/llm_peer_shapes.py), their targets' verdicts (bench/lib/llm_peer_targets.py),
how llm_peer and llm_vllm pick the shapes, the converter command a Qwen3-MoE on the SPM vocabulary gets, and what
a MoE step computes and reads; no model made, no server started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lib import llamacpp, llm_peer_shapes
from bench.lib.llm_models import VOCAB, _config, run_flops, weight_shapes
from bench.lib.llm_peer_report import WHOLE, _reads
from bench.lib.llm_peer_shapes import KEYS, MOE, SHAPES, WIDE, chosen, smoke
from bench.lib.llm_peer_targets import Target, target_lines
from bench.scenarios import llm_peer, llm_vllm, step_breakdown


def test_the_peer_shapes_are_the_issues_four_on_the_spm_vocabulary() -> None:
    assert KEYS == ("100m", "1b", "moe", "wide")
    shapes = {shape.key: shape for shape in SHAPES}
    assert [shapes[key].folder for key in KEYS] == ["llama-100m-spm", "llama-1b-spm", "qwen3_moe-moe-spm",
                                                    "llama-wide-spm"]  # the Llamas' folders as before
    moe = _config(shapes["moe"].model_type, vocab_size=VOCAB, **shapes["moe"].config)
    assert (moe.model_type, moe.hidden_size, moe.num_hidden_layers, moe.num_experts, moe.moe_intermediate_size,
            moe.num_experts_per_tok, moe.num_attention_heads, moe.num_key_value_heads, moe.head_dim,
            moe.norm_topk_prob, moe.tie_word_embeddings) == ("qwen3_moe", 1024, 8, 16, 512, 4, 16, 4, 64, True, False)
    weights = weight_shapes(moe)
    assert weights["lm_head.weight"] == (VOCAB, 1024)  # untied
    assert weights["model.layers.7.mlp.experts.15.down_proj.weight"] == (1024, 512)  # one tensor an expert
    wide = _config(shapes["wide"].model_type, vocab_size=VOCAB, **shapes["wide"].config)
    assert (wide.model_type, wide.hidden_size, wide.intermediate_size, wide.num_hidden_layers,
            wide.num_attention_heads, wide.num_key_value_heads, wide.tie_word_embeddings) == (
        "llama", 2048, 8192, 4, 32, 8, False)


def test_step_breakdown_measures_the_same_moe_and_wide_layers() -> None:
    assert step_breakdown.MOE is MOE and step_breakdown.WIDE is WIDE
    assert step_breakdown.CASES["moe"].shape is MOE and step_breakdown.CASES["wide"].shape is WIDE


def test_shapes_are_picked_in_order_and_an_unknown_key_is_refused() -> None:
    assert [s.key for s in chosen(["wide", "100m", "moe"])] == ["100m", "moe", "wide"]
    with pytest.raises(ValueError, match=r"unknown shape.*7b.*choose from 100m, 1b, moe, wide"):
        chosen(["7b", "moe"])


def test_a_smoke_run_serves_one_short_request_at_c1() -> None:
    shape = smoke(SHAPES[2])
    assert (shape.concurrency, shape.sequential, shape.warm, shape.new_tokens, shape.max_repeats) == ((1,), 1, 1, 8, 1)
    assert (shape.key, shape.config, shape.model_type) == ("moe", MOE, "qwen3_moe")


def test_the_scenarios_options_take_the_new_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert llm_vllm.parse_options([]) == {"shapes": ["100m"], "smoke": False}
    assert llm_vllm.parse_options(["--shapes", "moe,wide", "--smoke"]) == {"shapes": ["moe", "wide"], "smoke": True}
    with pytest.raises(SystemExit):
        llm_vllm.parse_options(["--shapes", "100m,7b"])
    assert llm_peer.parse_options(["--smoke"]) == {"smoke": True}


def test_targets_take_the_better_peer_and_say_met_behind_or_not_measured() -> None:
    targets = (Target("mbuild int8", ("vLLM bf16",), 1.5), Target("mbuild fp32", ("vLLM fp32", "llama.cpp f32"), 1.1),
               Target("mbuild int4", ("vLLM bf16",), 1.0))
    tok_s = {"mbuild int8": 160.0, "vLLM bf16": 100.0, "mbuild fp32": 100.0, "vLLM fp32": 80.0, "llama.cpp f32": 95.0}
    ttft = {"mbuild int8": 300.0, "mbuild fp32": 500.0, "vLLM bf16": 250.0, "llama.cpp f32": 400.0}
    record: dict[str, dict[str, object]] = {}
    line, blank = target_lines(targets, 16, tok_s, ttft, record)
    assert blank == ""
    assert line == ("Targets at c=16: mbuild int8 / vLLM bf16: 1.60x (met) against >= 1.5x; mbuild fp32 / the better "
                    "of vLLM fp32 and llama.cpp f32 (llama.cpp f32): 1.05x (**behind**) against >= 1.1x; mbuild int4 "
                    "/ vLLM bf16: not measured against >= 1.0x. TTFT p50 at c=16: mbuild int8 300 ms, mbuild fp32 "
                    "500 ms against the best peer's 250 ms (vLLM bf16).")
    assert record["mbuild fp32 / the better of vLLM fp32 and llama.cpp f32"] == {
        "wanted": 1.1, "measured": pytest.approx(100 / 95), "peer": "llama.cpp f32"}
    assert record["ttft_p50_ms"]["best peer"] == "vLLM bf16"


def test_the_scenarios_targets_are_the_issues() -> None:
    assert [(t.mine, t.peers, t.wanted) for t in llm_vllm.TARGETS] == [
        ("mbuild int8", ("vLLM bf16",), 1.5), ("mbuild fp32", ("vLLM fp32",), 1.1)]
    assert [(t.mine, t.peers, t.wanted) for t in llm_peer.TARGETS] == [
        ("mbuild int8", ("llama.cpp q8_0",), 1.5), ("mbuild fp32", ("llama.cpp f32",), 1.1)]


def test_a_qwen3_moe_on_the_spm_vocabulary_converts_through_spm_first(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "SPM_FIRST", tmp_path / "convert_spm_first.py")
    folders = (("moe", "qwen3_moe", True), ("moe-bpe", "qwen3_moe", False), ("llama", "llama", True))
    for name, model_type, spm in folders:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": model_type}))
        if spm:
            (tmp_path / name / "tokenizer.model").write_bytes(b"")
    converters = {name: llamacpp.convert_command(tmp_path / name, tmp_path / "out.gguf", "f32")[1]
                  for name in ("moe", "moe-bpe", "llama")}
    assert converters == {"moe": str(tmp_path / "convert_spm_first.py"), "moe-bpe": str(llamacpp.CONVERTER),
                          "llama": str(llamacpp.CONVERTER)}
    script = (tmp_path / "convert_spm_first.py").read_text()
    compile(script, "convert_spm_first.py", "exec")
    assert "Qwen3MoeModel.set_vocab = set_vocab" in script and repr(str(llamacpp.CONVERTER)) in script


def test_make_model_makes_the_shapes_checkpoint_in_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[Path, str, dict[str, object]]] = []

    def maker(folder: Path, model_type: str, shape: dict[str, object], vocab: Path) -> Path:
        made.append((folder, model_type, shape))
        return folder

    monkeypatch.setattr(llm_peer_shapes, "make_spm_decoder", maker)
    assert llm_peer_shapes.make_model(SHAPES[2], tmp_path) == tmp_path / "qwen3_moe-moe-spm"
    assert made == [(tmp_path / "qwen3_moe-moe-spm", "qwen3_moe", MOE)]


def test_a_moe_runs_flops_count_the_router_and_the_routed_experts_only() -> None:
    config = {**MOE, "vocab_size": VOCAB}
    config.pop("num_experts")
    config["num_local_experts"] = 16  # as transformers 5 writes config.json
    dense = {**config, "num_local_experts": 0, "intermediate_size": 4 * 512}  # its top-4 experts as one MLP
    router = 2 * 8 * 1024 * 16 * 63  # 2 x layers x hidden x experts a position, 63 positions
    assert run_flops(config, 32, 32, 2) == run_flops(dense, 32, 32, 2) + 2 * router


def test_a_moes_step_reads_its_routed_experts_at_c1() -> None:
    assert _reads(SHAPES[0]) == WHOLE
    assert "of each layer's 16 experts the 4 the token is routed to" in _reads(SHAPES[2])
