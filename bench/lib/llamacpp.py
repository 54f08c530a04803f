"""llama.cpp as a peer: its C++ `llama-server` built from the llama-cpp-python sdist's vendored tree, GGUF files
converted from a Hugging Face folder, and the server's command line with the flags the comparison holds fair.

Everything lands in a cache outside the repo (BENCH_CACHE, default ~/.cache/mbuild-bench) and is made only when
missing: the build takes about 18 minutes on two busy cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib.harness import skipped
from bench.lib.llm_models import save_spm_model
from bench.lib.rss import run_sampled
from bench.lib.servers import HOST

VERSION = "0.3.36"  # llama-cpp-python, whose sdist vendors llama.cpp
CACHE = Path(os.environ.get("BENCH_CACHE") or Path.home() / ".cache" / "mbuild-bench")
SDIST = CACHE / f"llama_cpp_python-{VERSION}"
VENDOR = SDIST / "vendor" / "llama.cpp"
BUILD = CACHE / "build-llama-noamx"  # renamed when the flags changed, so an older build is not reused
BINARIES = ("llama-server", "llama-quantize", "llama-batched-bench")
SPM_VOCAB = VENDOR / "models" / "ggml-vocab-llama-spm.gguf"
BPE_VOCAB = VENDOR / "models" / "ggml-vocab-llama-bpe.gguf"  # Llama 3's 128256-token vocabulary
QWEN2_VOCAB = VENDOR / "models" / "ggml-vocab-qwen2.gguf"  # Qwen2's, which Qwen3 and Qwen3-MoE ship too
CONVERTER = VENDOR / "convert_hf_to_gguf.py"
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
               # This host's CPU lists amx_tile/amx_int8 but its VM faults on them: a native build dies in ggml's
               # AMX kernels (SIGILL at tilezero, SIGSEGV at ldtilecfg) on every q8_0/q4_0 model, measured.
               # GCC's explicit -mno-* outlasts -march=native, so the rest of the native ISA stays.
               "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
               "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"]
QUANTS = {"q8_0": "Q8_0", "q4_0": "Q4_0"}  # our name -> llama-quantize's type


def binary(name: str) -> Path:
    return BUILD / "bin" / name


def ensure_source() -> Path:
    """The vendored llama.cpp tree, from `pip download` of the sdist (no wheel: the sdist carries the sources)."""
    if not (VENDOR / "CMakeLists.txt").is_file():
        archive = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
        if not archive.is_file():
            CACHE.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={VERSION}", "--dest", str(CACHE)], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(CACHE, filter="data")
    return VENDOR


def built() -> bool:
    return all(binary(name).is_file() for name in BINARIES)


def peer(quick: bool) -> bool:
    """Whether this run has llama.cpp's arms: built when missing (about 18 minutes), except in a quick run,
    which leaves them out with one line saying so, as it does where the converter's sentencepiece is missing
    (a full run stops there, before it measures anything)."""
    if quick and not built():
        skipped("llama.cpp's arms", f"llama.cpp is not built in {BUILD}; `python -m bench llm_peer` (no --quick) "
                "builds it once, about 18 minutes on two cores (cmake and ninja needed)")
        return False
    if importlib.util.find_spec("sentencepiece") is None:  # the converter imports it before it reads a vocabulary
        if quick:
            skipped("llama.cpp's arms", "its convert_hf_to_gguf.py needs sentencepiece (the dev extra has it)")
            return False
        raise RuntimeError("llama.cpp's convert_hf_to_gguf.py needs sentencepiece: pip install sentencepiece")
    ensure_built()
    return True


def ensure_built(jobs: int = 2) -> Path:
    """llama-server, llama-quantize and llama-batched-bench, configured as machine-notes.md says; built only when
    missing. The source tree stays too: its converter and vocab GGUF make the models."""
    source = ensure_source()
    if built():
        return BUILD / "bin"
    if shutil.which("ninja") is None:
        raise RuntimeError("building llama.cpp needs cmake and ninja (apt-get install cmake ninja-build)")
    print(f"  building llama.cpp {VERSION} (vendored) into {BUILD}: about 18 minutes on two cores")
    log = CACHE / "cmake.log"
    with log.open("w") as out:
        subprocess.run(["cmake", "-S", str(source), "-B", str(BUILD), *CMAKE_FLAGS], check=True, stdout=out,
                       stderr=subprocess.STDOUT)
        subprocess.run(["cmake", "--build", str(BUILD), "--target", *BINARIES, f"-j{jobs}"], check=True,
                       stdout=out, stderr=subprocess.STDOUT)
    return BUILD / "bin"


def gguf_env() -> dict[str, str]:
    """convert_hf_to_gguf.py imports `gguf` from the vendored gguf-py (not installed) and needs sentencepiece."""
    paths = [str(VENDOR / "gguf-py"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


# convert_hf_to_gguf.py's Qwen3-MoE class (a Qwen2MoeModel) reads only a byte-level BPE vocabulary, where the dense
# Qwen2 and Qwen3 classes try tokenizer.model (SentencePiece) first: on the Llama SPM vocabulary it stops at "BPE
# pre-tokenizer was not recognized". This runs the converter unchanged but for that: Qwen3-MoE's vocabulary read as
# the dense classes read it (the same SentencePiece path the Llamas take), the BPE path where there is no
# tokenizer.model. No published Qwen3-MoE ships an SPM vocabulary: only the benchmark's own checkpoints need it.
SPM_FIRST = CACHE / "convert_hf_to_gguf_spm_first.py"
SPM_FIRST_SOURCE = f"""import runpy
import sys

sys.path.insert(0, {str(VENDOR)!r})  # the converter's folder: its conversion package
from conversion import qwen  # noqa: E402

bpe = qwen.Qwen3MoeModel.set_vocab


def set_vocab(self):
    try:
        self._set_vocab_sentencepiece()
    except FileNotFoundError:
        bpe(self)


qwen.Qwen3MoeModel.set_vocab = set_vocab
sys.argv[0] = {str(CONVERTER)!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert_command(model: Path, out: Path, outtype: str) -> list[str]:
    """The vendored convert_hf_to_gguf.py writing `model` to `out` as `outtype` (f32, bf16, q8_0, ...); run it
    with gguf_env(). A Qwen3-MoE with a SentencePiece tokenizer.model goes through SPM_FIRST."""
    converter = CONVERTER
    if (model / "tokenizer.model").is_file() and _model_type(model) == "qwen3_moe":
        SPM_FIRST.write_text(SPM_FIRST_SOURCE)
        converter = SPM_FIRST
    return [sys.executable, str(converter), str(model), "--outfile", str(out), "--outtype", outtype]


def _model_type(model: Path) -> str | None:
    config = model / "config.json"
    return str(json.loads(config.read_text()).get("model_type")) if config.is_file() else None


def spm_ready(model: Path) -> Path:
    """`model` (made with the Llama SPM vocabulary) with the tokenizer.model the converter reads its scores from."""
    if not (model / "tokenizer.model").is_file():
        save_spm_model(model, SPM_VOCAB)
    return model


def quantize_command(source: Path, out: Path, kind: str) -> list[str]:
    """llama-quantize writing `kind` (q8_0, q4_0) of the GGUF `source` to `out`, on one thread."""
    return [str(binary("llama-quantize")), str(source), str(out), QUANTS[kind], "1"]


def _step(command: Callable[[Path], list[str]], out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One step that writes `out` (the command of the file it writes), under the memory sampler: its summary."""
    unfinished = out.with_suffix(".part")
    run = run_sampled(command(unfinished), env)
    if run.rc:
        raise RuntimeError(f"{' '.join(command(unfinished)[:2])} failed (exit {run.rc}): {' | '.join(run.tail(4))}")
    unfinished.rename(out)
    return {**run.summary(), "output_bytes": out.stat().st_size}


def _record(model: Path, folder: Path) -> Path:
    return folder / f"{model.name}-ggufs.json"


def ggufs(model: Path, folder: Path, kinds: tuple[str, ...] = ("f32", *QUANTS), source: str = "f32") -> dict[str, Path]:
    """GGUFs of `model` (`kinds` of f32, bf16, q8_0, q4_0), made as a user makes them and cached in `folder`: the
    converter writes `source` (f32 or bf16) and any other of f32 and bf16 asked for, llama-quantize makes the
    quantized kinds from `source`, which is deleted after unless asked for. Each step runs under the memory
    sampler; gguf_steps reads what they took. Give a model on the Llama SPM vocabulary spm_ready first."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {kind: folder / f"{model.name}-{kind}.gguf" for kind in (source, *kinds)}
    if all(files[kind].is_file() for kind in kinds):
        return {kind: files[kind] for kind in kinds}
    record = _record(model, folder)
    steps = json.loads(record.read_text()) if record.is_file() else {}
    env = {**gguf_env(), "HF_HUB_OFFLINE": "1"}
    for kind in dict.fromkeys((source, *kinds)):  # the source first
        if files[kind].is_file():
            continue
        if kind in QUANTS:
            steps[f"llama-quantize {kind}"] = _step(partial(quantize_command, files[source], kind=kind), files[kind],
                                                    env)
        else:
            steps[f"convert_hf_to_gguf.py --outtype {kind}"] = _step(partial(convert_command, model, outtype=kind),
                                                                    files[kind], env)
        record.write_text(json.dumps(steps, indent=2) + "\n")
    if source not in kinds:
        files[source].unlink()
    return {kind: files[kind] for kind in kinds}


def gguf_steps(model: Path, folder: Path) -> dict[str, dict[str, Any]]:
    """What each step ggufs ran for `model` took (wall time, peak RSS: Sampled.summary), by its command."""
    record = _record(model, folder)
    return dict(json.loads(record.read_text())) if record.is_file() else {}


def batched_steps(gguf: Path, batches: tuple[int, ...], contexts: tuple[int, ...],
                  new_tokens: int) -> dict[tuple[int, int], float]:
    """llama-batched-bench's decode ms per step, by (batch, context): one thread, its defaults otherwise; it
    prefills `context` tokens in each of B sequences, then times `new_tokens` decode steps of all B."""
    total = max(batches) * (max(contexts) + new_tokens) + 64
    out = subprocess.run([str(binary("llama-batched-bench")), "-m", str(gguf), "-c", str(total),
                          "-b", "2048", "-ub", "512", "-t", "1", "-tb", "1", "-ntg", str(new_tokens),
                          "-npp", ",".join(map(str, contexts)), "-npl", ",".join(map(str, batches))],
                         capture_output=True, text=True, check=True, timeout=7200)
    steps = {}
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and re.fullmatch(r"\d+", cells[0]):
            context, tg, batch, t_tg = int(cells[0]), int(cells[1]), int(cells[2]), float(cells[6])
            steps[(batch, context)] = t_tg / tg * 1000
    missing = [(b, c) for b in batches for c in contexts if (b, c) not in steps]
    if missing:
        raise RuntimeError(f"llama-batched-bench printed no row for {missing}:\n{out.stdout[-2000:]}")
    return steps


def serve(gguf: Path, port: int, context: int, slots: int = 16) -> list[str]:
    """llama-server with one thread for decode and prefill, `slots` sequences batched continuously, and
    `context` tokens per slot (-c is the total over the slots)."""
    return [str(binary("llama-server")), "-m", str(gguf), "--host", HOST, "--port", str(port),
            "--threads", "1", "--threads-batch", "1", "--parallel", str(slots), "--cont-batching",
            "-c", str(context * slots), "--no-webui"]


def ngram_flags(drafts: int, lookup: int) -> list[str]:
    """llama-server's prompt lookup, no draft model: ngram-simple drafts the `drafts` tokens that followed the latest
    earlier occurrence of the sequence's last `lookup` tokens (common/ngram-map.cpp), in every slot of a batch."""
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(lookup),
            "--spec-ngram-simple-size-m", str(drafts)]


def draft_flags(draft: Path, drafts: int) -> list[str]:
    """llama-server's draft-model speculation (draft-simple): `draft` (a GGUF) proposes up to `drafts` tokens a
    step, on one thread; a p-min of 0 drafts whatever the draft's confidence (mbuild has no such floor)."""
    return ["--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max", str(drafts),
            "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", "1", "-tbd", "1"]
