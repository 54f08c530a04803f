"""The image as an NVIDIA Dynamo worker (`python -m runtimes.dynamo`): Dynamo's backend SDK (dynamo.common.backend:
its Worker registers the model, serves the endpoint, watches cancellation and shuts down) around mbuild's own
scheduler. The frontend tokenizes and renders chat from the card (card.py) and routes token ids here; this engine
maps each request onto the scheduler (requests.py), streams its tokens back, and publishes what the prefix cache
holds as KV blocks (stored and removed) with the slots' load, which the KV router routes by. With
`--disaggregation-mode prefill` it runs prompts only and serves their KV; with `decode` it pulls a prompt's KV from
the prefill worker that ran it before decoding (kv_transfer.py).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import socket
import tempfile
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from dynamo._core import Context
from dynamo.common.backend import EngineConfig, LLMEngine, LlmRegistration, WorkerConfig
from dynamo.common.backend.disagg import enforce_prefill_max_tokens, extract_prefill_result
from dynamo.common.backend.engine import GenerateChunk, GenerateRequest
from dynamo.common.backend.health_check import is_probe
from dynamo.common.backend.publisher import ComponentSnapshot, KvEventSource, PushSource
from dynamo.common.constants import DisaggregationMode
from dynamo.llm.exceptions import InvalidArgument, Unknown

from runtimes.bundle import load_engine_config, load_metadata
from runtimes.dynamo.card import write_card
from runtimes.dynamo.kv_transfer import KvServer, TransferError, fetch
from runtimes.dynamo.requests import GUIDED, chunk, guide_of, parsers, sampling_params
from runtimes.encoder_batcher import QueueFull
from runtimes.generation.loader import GenerationRuntime
from runtimes.generation.prefix_cache import BLOCK
from runtimes.generation.requests import Event, Inadmissible, Request
from runtimes.generation.sampling_request import InvalidSampling, compile_guide
from runtimes.metrics import Metrics
from runtimes.settings import Settings

log = logging.getLogger("mbuild.dynamo")
ROLES = (DisaggregationMode.AGGREGATED, DisaggregationMode.PREFILL, DisaggregationMode.DECODE)
PUBLISH_SECONDS = 0.05  # how often the publisher thread sends KV events and the load


class MbuildEngine(LLMEngine):
    def __init__(self, settings: Settings, card: Path, name: str) -> None:
        self.settings, self.card, self.name = settings, card, name
        self.runtime: GenerationRuntime | None = None
        self.snapshots: Any = None
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.role, self.kv_host, self.kv_port = DisaggregationMode.AGGREGATED, "127.0.0.1", 0
        self.kv_server: KvServer | None = None

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[MbuildEngine, WorkerConfig]:
        parser = argparse.ArgumentParser(prog="python -m runtimes.dynamo")
        parser.add_argument("--namespace", default="mbuild")
        parser.add_argument("--component", default="worker")
        parser.add_argument("--discovery-backend", default="file", choices=["file", "etcd", "kubernetes", "mem"])
        parser.add_argument("--request-plane", default="tcp", choices=["tcp", "nats", "http"])
        parser.add_argument("--event-plane", default="zmq", choices=["zmq", "nats"])
        parser.add_argument("--disaggregation-mode", default="agg", choices=[m.value for m in ROLES],
                            help="prefill: run prompts and hand their KV to decode workers; decode: take it")
        parser.add_argument("--kv-host", default=None, help="prefill: the address decode workers reach this "
                            "worker's KV at (default: this host's name resolved)")
        parser.add_argument("--kv-port", type=int, default=0, choices=range(65536), metavar="0..65535",
                            help="prefill: the port it serves KV on (default: an ephemeral one)")
        args = parser.parse_args(argv)
        settings = Settings.from_env()
        config = load_engine_config(settings.model_dir)
        metadata = load_metadata(settings.model_dir)
        name = settings.served_name or (metadata.model.repo if metadata else "model")
        card = write_card(settings.model_dir, config, Path(tempfile.gettempdir()))
        engine = cls(settings, card, name)
        engine.role = DisaggregationMode(args.disaggregation_mode)
        if engine.role == DisaggregationMode.PREFILL:  # only a prefill worker serves KV: no lookup for the others
            engine.kv_host = args.kv_host or socket.gethostbyname(socket.gethostname())
        engine.kv_port = args.kv_port
        tool_parser, reasoning_parser = parsers(config.decoder.chat_template, settings.tool_call_parser)
        return engine, WorkerConfig(namespace=args.namespace, component=args.component, endpoint="generate",
                                    model_name=str(card), served_model_name=name,
                                    # Dynamo renders chat from the card's template: without one, completions only
                                    endpoint_types="chat,completions" if config.decoder.chat_template
                                    else "completions",
                                    discovery_backend=args.discovery_backend, request_plane=args.request_plane,
                                    event_plane=args.event_plane, tool_call_parser=tool_parser,
                                    reasoning_parser=reasoning_parser, disaggregation_mode=engine.role)

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        model_dir = self.settings.model_dir
        config, metadata = load_engine_config(model_dir), load_metadata(model_dir)
        runtime = await asyncio.to_thread(GenerationRuntime.load, model_dir, config, self.settings, Metrics(),
                                          metadata)
        await asyncio.to_thread(runtime.engine.warm_up)
        runtime.engine_loop.scheduler.prefix.journal = collections.deque()
        runtime.engine_loop.start()
        self.runtime = runtime
        engine = runtime.engine
        if self.role == DisaggregationMode.PREFILL:
            self.kv_server = KvServer(self.kv_host, self.kv_port, runtime.engine_loop.scheduler.prefix.export,
                                      engine.context)
            log.info("serving prefilled KV at %s", self.kv_server.address)
        return EngineConfig(model=str(self.card), served_model_name=self.name, llm=LlmRegistration(
            context_length=engine.context, kv_cache_block_size=BLOCK,
            total_kv_blocks=runtime.engine_loop.scheduler.pool.total, max_num_seqs=engine.slots,
            max_num_batched_tokens=runtime.engine_loop.config.prefill_chunk))

    async def generate(self, request: GenerateRequest, context: Context) -> AsyncGenerator[GenerateChunk, None]:
        runtime = self.runtime
        assert runtime is not None, "generate before start"
        log.debug("request: %s", {k: v for k, v in request.items() if k != "token_ids"})
        prompt = [int(t) for t in request.get("token_ids") or []]
        if self.role == DisaggregationMode.PREFILL:
            enforce_prefill_max_tokens(request)  # the decode worker makes the answer (min_tokens is its to keep)
            cast(dict[str, Any], request.get("stop_conditions") or {}).pop("min_tokens", None)
        elif self.role == DisaggregationMode.DECODE and not is_probe(request):
            await asyncio.to_thread(self._pull, request, prompt)
        try:
            params = sampling_params(dict(request), runtime.context, len(prompt))
            spec = guide_of(request.get("sampling_options") or {})
            if spec is not None:
                params = replace(params, grammar=await asyncio.to_thread(compile_guide, runtime.grammars, GUIDED, spec))
            job = Request(prompt, params, asyncio.get_running_loop(), asyncio.Queue())
            runtime.engine_loop.submit([job])
        except (InvalidSampling, Inadmissible) as exc:  # the request's own: a 400 with the reason
            raise InvalidArgument(str(exc)) from exc
        except QueueFull as exc:
            raise Unknown(f"this worker's queue is full ({runtime.engine_loop.config.max_queue}, "
                          "MBUILD_MAX_QUEUE)") from exc
        made, held = 0, []
        try:
            while True:
                if context.is_stopped():
                    job.cancelled = True
                event: Event = await job.next_event()
                if event.finish == "error":
                    raise (InvalidArgument if event.refused else Unknown)(event.error or "generation failed")
                made += event.token is not None
                out = cast(GenerateChunk, chunk(event, len(prompt), made, self._decode))
                if self.kv_server is not None:  # prefill: Dynamo's prefill router reads one chunk, the last
                    held += out["token_ids"]
                    if event.finish is None:
                        continue
                    out["token_ids"], out["disaggregated_params"] = held, {"mbuild_kv": self.kv_server.address}
                yield out
                if event.finish is not None:
                    return
        finally:
            job.cancelled = True  # a client gone (the generator closed) or done: the scheduler drops it either way

    def _pull(self, request: GenerateRequest, prompt: list[int]) -> None:
        """A decode worker's request: the prompt's KV from the prefill worker that ran it, into this worker's
        prefix cache, where admission finds it. Without it (no handoff, an evicted entry, a failed move) the prompt
        is prefilled here: slower, never wrong."""
        assert self.runtime is not None
        handoff = (extract_prefill_result(request) or {}).get("disaggregated_params")
        address = handoff.get("mbuild_kv") if isinstance(handoff, dict) else None
        if not isinstance(address, str):
            log.warning("a request reached this decode worker without a prefill worker's KV; prefilling it here")
            return
        engine, prefix = self.runtime.engine, self.runtime.engine_loop.scheduler.prefix
        # a grown-cache engine (TensorRT's) keeps no prefix cache to take it into; a held prompt needs none
        if not engine.in_place or prefix.lookup(prompt)[1] >= (len(prompt) - 1) // BLOCK * BLOCK:
            return
        shapes = engine.block_shapes
        started = time.perf_counter()
        try:
            length, blocks = fetch(address, prompt, shapes, engine.kv_dtype)
        except TransferError as exc:
            log.warning("the prompt's KV did not come from %s (%s); prefilling it here", address, exc)
            return
        prefix.adopt(prompt[:length], blocks, length * engine.bytes_per_token)
        log.info("took the KV of %d of %d prompt tokens from %s in %.1f ms", length, len(prompt), address,
                 (time.perf_counter() - started) * 1000)

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
            journal = runtime.engine_loop.scheduler.prefix.journal
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
                pool = runtime.engine_loop.scheduler.pool
                used, total = min(pool.used, pool.total), pool.total
                self.snapshots.publish(0, ComponentSnapshot(used, total, used / total, 0))

    async def cleanup(self) -> None:
        self.stop.set()
        if self.kv_server is not None:
            self.kv_server.close()
        if self.runtime is not None:
            await asyncio.to_thread(self.runtime.engine_loop.stop)
