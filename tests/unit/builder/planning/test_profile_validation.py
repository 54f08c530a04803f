"""A malformed profile set reports every problem at once, with file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import cli
from builder.engine.weight_writer import LinearFormat
from builder.planning.engine_options import ort_options
from builder.planning.profiles import ProfileSetError, load_profiles

GOOD = """
profiles:
  - engine: onnxruntime
    hardware: cpu
    tasks: [embedding]
    matrix: {precision: [fp32], mode: [latency]}
"""
BAD_A = """
profiles:
  - engine: onnxruntime
    hardware: cpu
    precision: fp64
    tasks: [embedding]
    colour: blue
  - engine: tensorrt
    hardware: a100
    tasks: [text-generation]
    matrix: {precision: [fp8, bf16], shards: [1]}
"""
BAD_B = """
profiles:
  - engine: tensorrt
    hardware: a100
    tasks: [text-generation]
    matrix: {precision: [fp8, nvfp4], mode: [latency]}
  - engine: tensorrt
    hardware: quantum-9000
    precision: bf16
    tasks: [embedding]
    limits: {max_batch: 0}
"""


def write(folder: Path, **files: str) -> Path:
    for name, text in files.items():
        (folder / f"{name}.yaml").write_text(text)
    return folder


def test_every_problem_in_every_file_at_once(tmp_path: Path) -> None:
    write(tmp_path, a=BAD_A, b=BAD_B, good=GOOD)
    with pytest.raises(ProfileSetError) as info:
        load_profiles([tmp_path])
    problems = info.value.problems
    joined = "\n".join(problems)
    assert "a.yaml: profiles[0]" in joined and "'precision'" in joined and "fp32" in joined  # allowed values
    assert "field 'colour' is not allowed" in joined and "engine" in joined  # lists allowed fields
    assert "a.yaml: profiles[1]: matrix keys ['shards'] are not allowed" in joined
    assert "b.yaml: profiles[0] (precision=fp8, mode=latency): fp8 needs compute capability >= 8.9" in joined
    assert "b.yaml: profiles[0] (precision=nvfp4, mode=latency): nvfp4 needs compute capability >= 10.0" in joined
    assert "b.yaml: profiles[1]: field 'limits.max_batch'" in joined
    assert len(problems) >= 6


def test_duplicate_names_and_stray_keys(tmp_path: Path) -> None:
    write(tmp_path, a=GOOD, b=GOOD + "\nanchors: {}\n")
    with pytest.raises(ProfileSetError) as info:
        load_profiles([tmp_path])
    joined = "\n".join(info.value.problems)
    assert "is already defined at a.yaml: profiles[0]" in joined
    assert "b.yaml: top-level keys ['anchors'] are not allowed" in joined


def test_the_cli_reports_them_with_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MBUILD_PROFILES_DIR", str(write(tmp_path, bad=BAD_B)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(cli, ["profiles", "llama-3.1-8b", "--gpu", "a100"])
    assert result.exit_code == 2
    assert "problem(s) in the profiles" in result.output and "bad.yaml: profiles[1]" in result.output
    assert "Traceback" not in result.output


def test_built_in_profiles_are_valid_and_named_by_the_rule() -> None:
    profiles = load_profiles()
    assert len({p.name for p in profiles}) == len(profiles) == len({p.id for p in profiles})
    for p in profiles:
        assert p.name == f"{p.engine}-{p.hardware}-{p.precision}-tp{p.tp}-{p.mode}"
        assert len(p.id) == 64
    hardware = {p.hardware for p in profiles}
    assert {"cpu", "cpu.avx512", "cpu.vnni", "a100", "a10g", "a40", "l4", "l40s", "h100", "h200", "b200",
            "gb200"} <= hardware
    assert {p.tp for p in profiles} == {1, 2, 4, 8}


def test_user_profiles_join_the_built_in_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = GOOD.replace("hardware: cpu", "hardware: cpu.vnni").replace("fp32", "int8")
    monkeypatch.setenv("MBUILD_PROFILES_DIR", str(write(tmp_path, mine=mine)))
    with pytest.raises(ProfileSetError, match="already defined"):
        load_profiles()  # same name as a built-in: refused, not silently shadowed


TYPO = """
profiles:
  - engine: onnxruntime
    hardware: cpu
    tasks: [embedding]
    precision: int8
    engine_options: {graph_optimisation: all, per_channel: 3, model_impl: ../generic}
  - engine: tensorrt
    hardware: h100
    tasks: [text-generation]
    precision: fp16
    engine_options: {workspace_gb: -1, kv_cache: fp4, graph_optimization: all}
"""


def test_engine_options_are_typed_per_backend_and_a_typo_names_the_key(tmp_path: Path) -> None:
    write(tmp_path, typo=TYPO)
    with pytest.raises(ProfileSetError) as info:
        load_profiles([tmp_path])
    joined = "\n".join(info.value.problems)
    assert "engine_options.graph_optimisation: onnxruntime has no such option" in joined
    assert "graph_optimization" in joined  # the allowed keys are listed, so the fix is visible
    assert "engine_options.per_channel" in joined
    assert "engine_options.model_impl" in joined  # one of auto, fast-lane, generic
    assert "engine_options.workspace_gb" in joined and "engine_options.kv_cache" in joined
    assert "engine_options.graph_optimization: tensorrt has no such option" in joined  # an ORT key on TensorRT
    assert len(info.value.problems) == 6


def test_each_cpu_class_quantizes_a_language_model_as_its_profile_says(tmp_path: Path) -> None:
    """The linear layers an int8/int4 language-model build writes, per CPU class (docs/llm.md's table)."""
    forms = {(p.hardware, p.precision): LinearFormat.for_profile(p.precision, ort_options(p.engine_options))
             for p in load_profiles() if p.device == "cpu" and "text-generation" in p.tasks and p.precision != "fp32"}
    vnni_int8 = forms["cpu.vnni", "int8"]  # 8-bit blocks, int8 compute, run by mbuild's MatMulInt8Tiles
    assert (vnni_int8.kind, vnni_int8.bits, vnni_int8.block_size, vnni_int8.accuracy_level) == ("nbits", 8, 128, 4)
    assert vnni_int8.tiles and not any(f.tiles for key, f in forms.items() if key != ("cpu.vnni", "int8"))
    for hardware in ("cpu", "cpu.avx512"):  # dynamic int8 with 7-bit weights where u8*s8 kernels saturate
        assert (forms[hardware, "int8"].kind, forms[hardware, "int8"].reduce_range) == ("int8", True)
    for hardware in ("cpu", "cpu.avx512", "cpu.vnni"):
        int4 = forms[hardware, "int4"]
        assert (int4.kind, int4.bits, int4.block_size, int4.accuracy_level) == ("nbits", 4, 128, 4)
    # a size ONNX Runtime's packer refuses, and mbuild's kernel's one block size, refused when profiles load
    for precision, options, why in (("int4", "quantization: blocks, block_size: 96", "block_size"),
                                    ("int8", "quantization: tiles, block_size: 64", "tiles runs blocks of 128")):
        write(tmp_path, odd=f"""
profiles:
  - engine: onnxruntime
    hardware: cpu
    tasks: [text-generation]
    precision: {precision}
    engine_options: {{{options}}}
""")
        with pytest.raises(ProfileSetError, match=why):
            load_profiles([tmp_path])
