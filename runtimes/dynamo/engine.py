"""The image as an NVIDIA Dynamo worker (`python -m runtimes.dynamo`): Dynamo's backend SDK (dynamo.common.backend:
its Worker registers the model, serves the endpoint, watches cancellation and shuts down) around mbuild's own
scheduler. The frontend tokenizes and renders chat from the card (card.py) and routes token ids here; this engine
maps each request onto the scheduler (requests.py), streams its tokens back, and publishes what the prefix cache
holds as KV blocks (stored and removed) with the slots' load, which the KV router routes by.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import tempfile
import threading
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from dynamo._core import Context
from dynamo.common.backend import EngineConfig, LLMEngine, LlmRegistration, WorkerConfig
from dynamo.common.backend.engine import GenerateChunk, GenerateRequest
from dynamo.common.backend.publisher import ComponentSnapshot, KvEventSource, PushSource
from dynamo.llm.exceptions import InvalidArgument, Unknown

from runtimes.bundle import load_engine_config, load_metadata
from runtimes.dynamo.card import write_card
from runtimes.dynamo.requests import Refused, chunk, guide_of, parsers, sampling_params
from runtimes.generation.guided import GuideError
from runtimes.generation.prefix_cache import BLOCK
from runtimes.generation.requests import Event, Request
from runtimes.generation.runtime import GenerationRuntime
from runtimes.generation.scheduler import Inadmissible, SchedulerFull
from runtimes.metrics import Metrics
from runtimes.settings import Settings

log = logging.getLogger("mbuild.dynamo")
PUBLISH_SECONDS = 0.05  # how often the publisher thread sends KV events and the load


class MbuildEngine(LLMEngine):
    def __init__(self, settings: Settings, card: Path, name: str) -> None:
        self.settings, self.card, self.name = settings, card, name
        self.runtime: GenerationRuntime | None = None
        self.snapshots: Any = None
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[MbuildEngine, WorkerConfig]:
        parser = argparse.ArgumentParser(prog="python -m runtimes.dynamo")
        parser.add_argument("--namespace", default="mbuild")
        parser.add_argument("--component", default="worker")
        parser.add_argument("--discovery-backend", default="file", choices=["file", "etcd", "kubernetes", "mem"])
        parser.add_argument("--request-plane", default="tcp", choices=["tcp", "nats", "http"])
        parser.add_argument("--event-plane", default="zmq", choices=["zmq", "nats"])
        args = parser.parse_args(argv)
        settings = Settings.from_env()
        config = load_engine_config(settings.model_dir)
        metadata = load_metadata(settings.model_dir)
        name = settings.served_name or (metadata.model.repo if metadata else "model")
        card = write_card(settings.model_dir, config, Path(tempfile.gettempdir()))
        engine = cls(settings, card, name)
        tool_parser, reasoning_parser = parsers(config.decoder.chat_template, settings.tool_call_parser)
        return engine, WorkerConfig(namespace=args.namespace, component=args.component, endpoint="generate",
                                    model_name=str(card), served_model_name=name,
                                    # Dynamo renders chat from the card's template: without one, completions only
                                    endpoint_types="chat,completions" if config.decoder.chat_template
                                    else "completions",
                                    discovery_backend=args.discovery_backend, request_plane=args.request_plane,
                                    event_plane=args.event_plane, tool_call_parser=tool_parser,
                                    reasoning_parser=reasoning_parser)

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        model_dir = self.settings.model_dir
        config, metadata = load_engine_config(model_dir), load_metadata(model_dir)
        runtime = await asyncio.to_thread(GenerationRuntime.load, model_dir, config, self.settings, Metrics(),
                                          metadata)
        await asyncio.to_thread(runtime.engine.warm_up)
        runtime.scheduler.prefix.journal = collections.deque()
        runtime.scheduler.start()
        self.runtime = runtime
        engine = runtime.engine
        return EngineConfig(model=str(self.card), served_model_name=self.name, llm=LlmRegistration(
            context_length=engine.context, kv_cache_block_size=BLOCK,
            total_kv_blocks=engine.slots * engine.context // BLOCK, max_num_seqs=engine.slots,
            max_num_batched_tokens=runtime.scheduler.batch.budget))

    async def generate(self, request: GenerateRequest, context: Context) -> AsyncGenerator[GenerateChunk, None]:
        runtime = self.runtime
        assert runtime is not None, "generate before start"
        log.debug("request: %s", {k: v for k, v in request.items() if k != "token_ids"})
        prompt = [int(t) for t in request.get("token_ids") or []]
        try:
            params = sampling_params(dict(request), runtime.context, len(prompt))
            spec = guide_of(request.get("sampling_options") or {})
            if spec is not None:
                params = replace(params, grammar=await asyncio.to_thread(runtime.grammars.compile, spec))
            job = Request(prompt, params, asyncio.get_running_loop(), asyncio.Queue())
            runtime.scheduler.submit([job])
        except (Refused, GuideError, Inadmissible) as exc:  # the request's own: a 400 with the reason
            raise InvalidArgument(str(exc)) from exc
        except SchedulerFull as exc:
            raise Unknown(f"this worker's queue is full ({runtime.scheduler.max_queue}, MBUILD_MAX_QUEUE)") from exc
        made = 0
        try:
            while True:
                if context.is_stopped():
                    job.cancelled = True
                event: Event = await job.next_event()
                if event.finish == "error":
                    raise (InvalidArgument if event.refused else Unknown)(event.error or "generation failed")
                made += event.token is not None
                yield cast(GenerateChunk, chunk(event, len(prompt), made, self._decode))
                if event.finish is not None:
                    return
        finally:
            job.cancelled = True  # a client gone (the generator closed) or done: the scheduler drops it either way

    def _decode(self, token: int) -> str:
        assert self.runtime is not None
        return str(self.runtime.tokenizer.decode([token], skip_special_tokens=False))

    async def kv_event_sources(self) -> list[KvEventSource]:
        return [PushSource(on_ready=self._publish, dp_rank=0)]

    def component_metrics_dp_ranks(self) -> list[int]:
        return [0]

    def attach_snapshot_publisher(self, publisher: Any) -> None:
        self.snapshots = publisher

    def _publish(self, publisher: Any) -> None:
        thread = threading.Thread(target=self._publish_loop, args=(publisher,), name="kv-events", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _publish_loop(self, publisher: Any) -> None:
        """The prefix cache's journal as KV events, and the slots' load, every PUBLISH_SECONDS."""
        while not self.stop.wait(PUBLISH_SECONDS):
            runtime = self.runtime
            if runtime is None:
                continue
            journal = runtime.scheduler.prefix.journal
            while journal:
                kind, tokens, keys, parent = journal.popleft()
                try:
                    if kind == "stored":
                        publisher.publish_stored(tokens, [BLOCK] * len(keys), keys, parent)
                    else:
                        publisher.publish_removed(keys)
                except Exception:  # one lost event costs routing quality, never a request
                    log.exception("a KV event was not published")
            if self.snapshots is not None:
                engine = runtime.engine
                total = engine.slots * engine.context // BLOCK
                used = int(engine.lengths.sum()) // BLOCK
                self.snapshots.publish(0, ComponentSnapshot(used, total, used / total, 0))

    async def cleanup(self) -> None:
        self.stop.set()
        if self.runtime is not None:
            await asyncio.to_thread(self.runtime.scheduler.stop)
