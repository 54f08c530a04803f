"""Everything a served language model needs at run time, loaded from its bundle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from runtimes.bundle import BundleError, BundleMetadata, EngineConfig
from runtimes.bundle.metadata import DRAFT_DIR
from runtimes.engines import decoder_for
from runtimes.engines.decoder import DecoderEngine
from runtimes.generation.chat_template import ChatTemplate, ChatTemplateError
from runtimes.generation.draft import DraftModel, open_draft
from runtimes.generation.engine_loop import EngineLoop
from runtimes.generation.guided import Grammars
from runtimes.generation.harmony import Harmony, detect_harmony, vocabulary_folder
from runtimes.generation.reasoning import CLOSE, OPEN, detect_reasoning, opened_by
from runtimes.generation.scheduler import SchedulerConfig
from runtimes.generation.speculative import Speculation
from runtimes.generation.tools import ToolFormat, chosen_format
from runtimes.metrics import Metrics
from runtimes.settings import Settings
from runtimes.tokenize import load_tokenizer


@dataclass
class GenerationRuntime:
    engine: DecoderEngine
    tokenizer: Tokenizer
    template: ChatTemplate | None
    engine_loop: EngineLoop
    context: int
    eos_ids: tuple[int, ...]
    grammars: Grammars
    tool_format: ToolFormat | None  # how this model writes tool calls; None: it was not taught to
    thinks: bool = False  # the template was written for a model that reasons between <think> tags
    harmony: Harmony | None = None  # gpt-oss: prompts and replies in harmony's format

    @classmethod
    def load(cls, model_dir: Path, config: EngineConfig, settings: Settings, metrics: Metrics,
             metadata: BundleMetadata | None = None) -> GenerationRuntime:
        """settings: threads, max_queue, speculation, and the optional max_batch (slots), prefill_chunk,
        prefix_cache_mb, kv_cache_mb; metadata: whether the bundle carries a draft model."""
        engine = decoder_for(model_dir, config, settings.threads, settings.max_batch)
        method, draft = _speculation(model_dir, engine, settings, metadata)
        tokenizer = load_tokenizer(model_dir / config.tokenizer_file)
        options = config.decoder
        template = None
        if options.chat_template:
            try:
                template = ChatTemplate(options.chat_template, dict(options.special_tokens))
            except ChatTemplateError as exc:
                raise BundleError(str(exc)) from exc
        eos = options.eos_token_ids
        # A grown-cache graph (TensorRT's) is built for whole prompts on an empty cache: no chunks, no reuse, no
        # speculation; a budget of two contexts always holds a whole prompt beside the decode rows.
        chunk = settings.prefill_chunk if engine.in_place else 2 * engine.context
        scheduling = SchedulerConfig(
            eos, engine.slots, settings.max_queue, engine.context, options.vocab_size, prefill_chunk=chunk,
            prefix_cache_bytes=settings.prefix_cache_mb << 20 if engine.in_place else 0,
            kv_cache_bytes=settings.kv_cache_mb << 20 or config.batching.kv_cache_bytes, chunked=engine.in_place,
            speculation=Speculation(method, settings.num_speculative_tokens, settings.prompt_lookup_min,
                                    settings.prompt_lookup_max))
        engine_loop = EngineLoop(engine, scheduling, metrics, draft)
        tools = chosen_format(settings.tool_call_parser, template.source if template else None)
        harmony = None
        if template and detect_harmony(template.source):
            harmony = Harmony(vocabulary_folder(model_dir / config.tokenizer_file, settings.harmony_vocabulary))
        return cls(engine, tokenizer, template, engine_loop, config.max_seq_length, eos,
                   Grammars(tokenizer, options.vocab_size, eos), None if harmony else tools,
                   bool(template and not harmony and detect_reasoning(template.source)), harmony)

    def tool_tokens(self) -> dict[str, int]:
        """The tool format's markers that are single tokens of this vocabulary (grammars name them by id)."""
        if self.tool_format is None:
            return {}
        found = {s: self.tokenizer.token_to_id(s) for s in self.tool_format.markers}
        return {s: i for s, i in found.items() if i is not None}

    def marker_ids(self, tools: bool) -> frozenset[int]:
        """The reply's markers that are tokens of their own: <think> and </think> for a model that reasons, and the
        tool format's where tools were offered."""
        markers: tuple[str, ...] = (OPEN, CLOSE) if self.thinks else ()
        if tools and self.tool_format is not None:
            markers += self.tool_format.markers
        return frozenset(i for marker in markers if (i := self.tokenizer.token_to_id(marker)) is not None)

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special).ids)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.chat_prompt(messages, tools, add_generation_prompt=add_generation_prompt)[0]

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    kwargs: dict[str, Any] | None = None, effort: str | None = None,
                    add_generation_prompt: bool = True) -> tuple[list[int], bool]:
        """The prompt's ids, and whether it opened the reply's reasoning (a template that ends with <think>).
        kwargs: the request's chat_template_kwargs; effort: its reasoning_effort (harmony's, or the template's)."""
        if self.harmony is not None and add_generation_prompt:
            return self.harmony.render(messages, tools, effort), False
        if self.template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions with a plain prompt")
        if self.tool_format is not None:
            messages = self.tool_format.place_tools(messages, tools)
        extra = {**({"reasoning_effort": effort} if effort else {}), **(kwargs or {})}
        text = self.template.render(messages, add_generation_prompt, tools, extra)
        opened = False
        if self.thinks and add_generation_prompt:  # what the template adds for the reply: after the conversation
            bare = self.template.render(messages, False, tools, extra)
            same = next((i for i, (a, b) in enumerate(zip(text, bare, strict=False)) if a != b), len(bare))
            opened = opened_by(text[same:])
        # The template writes the BOS itself, so the tokenizer must not add another.
        return self.encode(text, special=False), opened


def _speculation(model_dir: Path, engine: DecoderEngine, settings: Settings,
                 metadata: BundleMetadata | None) -> tuple[str, DraftModel | None]:
    """The speculation method the server runs, and its draft model when it drafts with one."""
    carried = metadata is not None and metadata.draft is not None
    method = settings.speculative if settings.speculative != "auto" else "draft" if carried else "off"
    if method == "draft" and not carried:
        raise BundleError("MBUILD_SPECULATIVE=draft, but this bundle carries no draft model; build it with "
                          "`mbuild package TARGET --draft DRAFT`, or set MBUILD_SPECULATIVE=ngram or off")
    if not engine.in_place:  # TensorRT's profiles (grown-cache graph) take no multi-token step over a past
        return "off", None
    if method != "draft":
        return method, None
    return method, open_draft(model_dir / DRAFT_DIR, engine, settings.threads)
