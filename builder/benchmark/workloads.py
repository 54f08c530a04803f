"""What a sweep sends: a preset (InferenceMAX's input/output lengths for language models; passages for
embedders) or the user's own prompts, turned into AIPerf's arguments."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from builder.errors import InputError
from builder.safepaths import read_regular

MAX_PROMPTS_BYTES = 256 << 20
MAX_PROMPTS = 100_000
MAX_PROMPT_CHARS = 1 << 20
MAX_LENGTH = 131_072


@dataclass(frozen=True)
class Preset:
    isl: int
    osl: int
    shared: int = 0  # tokens of one context every request starts with (RAG's retrieved document)
    about: str = ""


# InferenceMAX's shapes (1k/1k, 1k/8k, 8k/1k) and a RAG shape whose document is shared, as a prefix cache sees it.
PRESETS = {
    "chat": Preset(1024, 1024, about="1k in, 1k out (InferenceMAX's 1k/1k)"),
    "reasoning": Preset(1024, 8192, about="1k in, 8k out (InferenceMAX's 1k/8k)"),
    "summarization": Preset(8192, 1024, about="8k in, 1k out (InferenceMAX's 8k/1k)"),
    "rag": Preset(256, 256, shared=4096, about="one 4k-token document shared by every request, a 256-token "
                                                "question, 256 out"),
    "embed": Preset(256, 0, about="one 256-token passage a request (embedders and rerankers)"),
}


@dataclass(frozen=True)
class Workload:
    name: str
    isl: int
    osl: int
    shared: int = 0
    dataset: str = ""  # the user's prompts, checked and rewritten as AIPerf's single_turn JSONL ("" for a preset)
    prompts: Path | None = None  # where dataset was written for AIPerf

    def arguments(self, generates: bool) -> list[str]:
        """AIPerf's input options; a language model is asked for exactly osl tokens (ignore_eos), so every
        point measures the lengths it names."""
        if self.prompts is not None:
            args = ["--custom-dataset-type", "single_turn", "--input-file", str(self.prompts)]
        else:
            args = ["--isl", str(self.isl), "--isl-stddev", "0"]
            if self.shared:
                args += ["--shared-system-prompt-length", str(self.shared)]
        if generates:
            args += ["--osl", str(self.osl), "--osl-stddev", "0", "--extra-inputs", "ignore_eos:true"]
        return args


def _length(what: str, value: int | None, default: int) -> int:
    chosen = default if value is None else value
    if not 1 <= chosen <= MAX_LENGTH:
        raise InputError(f"{what} {chosen} is outside 1..{MAX_LENGTH}", hint=f"give {what} within that range")
    return chosen


def _rewritten(source: Path) -> tuple[str, int]:
    """The user's JSONL ({"text": ..., "output_length": N} a line), checked line by line and rewritten with only
    those fields: AIPerf reads nothing else of it. Read whole before the output folder is touched (the file may
    lie in it). The largest output_length, for the report."""
    hint = 'give one JSON object a line: {"text": "a prompt"} or {"text": "...", "output_length": 128}'
    text = read_regular(source, MAX_PROMPTS_BYTES, "--prompts", hint).decode(errors="replace")
    lines, longest = [], 0
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"--prompts {source}, line {number}"
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{where} is not JSON ({'nested too deep' if isinstance(exc, RecursionError) else exc})",
                             hint=hint) from exc
        prompt = entry.get("text") if isinstance(entry, dict) else None
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
            raise InputError(f"{where} needs a non-empty \"text\" of at most {MAX_PROMPT_CHARS} characters",
                             hint=hint)
        out = entry.get("output_length")
        if out is not None and (type(out) is not int or not 1 <= out <= MAX_LENGTH):
            raise InputError(f"{where}: output_length must be a whole number in 1..{MAX_LENGTH}", hint=hint)
        lines.append(json.dumps({"text": prompt, **({"output_length": out} if out else {})}))
        longest = max(longest, out or 0)
        if len(lines) > MAX_PROMPTS:
            raise InputError(f"--prompts {source} holds over {MAX_PROMPTS} prompts", hint=hint)
    if not lines:
        raise InputError(f"--prompts {source} holds no prompt", hint=hint)
    return "\n".join(lines) + "\n", longest


def workload(name: str, isl: int | None, osl: int | None, prompts: Path | None) -> Workload:
    """What a sweep sends, every length and prompt checked; nothing is written."""
    preset = PRESETS[name]
    if prompts is not None:
        dataset, longest = _rewritten(prompts)
        return Workload("prompts", 0, _length("--osl", osl, longest or preset.osl or 1), dataset=dataset)
    return Workload(name, _length("--isl", isl, preset.isl), _length("--osl", osl, preset.osl or 1), preset.shared)


def check_fits(load: Workload, generates: bool, context: int, target: str) -> None:
    """A request longer than the model's context is refused by the server (400) at every point: refused here,
    before any load, with lengths that fit. Only what cannot fit at all is refused: a chat template's own tokens
    are the server's to count, so the lengths suggested leave them room."""
    room = min(64, context // 8)
    each = max(1, (context - room) // 2)
    if generates:
        asked = load.isl + load.shared + load.osl
        if load.dataset and load.osl >= context:
            raise InputError(f"--prompts asks for up to {load.osl} output tokens a request, and {target} holds "
                             f"{context} tokens of context in all, its prompt included",
                             hint=f"give each prompt an output_length (or --osl) that leaves room, e.g. --osl {each}")
        if load.dataset or asked <= context:
            return
        shared = f" + {load.shared} shared" if load.shared else ""
        raise InputError(f"the {load.name} workload asks {load.isl}{shared} tokens in and {load.osl} out a request "
                         f"({asked} in all); {target} holds {context} tokens of context, so every request would be "
                         "refused", hint=f"pass lengths that fit, e.g. {'--workload chat ' if load.shared else ''}"
                                         f"--isl {each} --osl {each}")
    if not load.dataset and load.isl > context:
        raise InputError(f"the {load.name} workload sends {load.isl} tokens a request; {target} takes at most "
                         f"{context}, so every request would be refused", hint=f"pass --isl {context - room} or less")
