"""What the service holds while it runs: settings, health, metrics, and (once loaded) the engine."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtimes.bundle import BundleMetadata, EngineConfig, GateReport, load_engine_config, load_metadata, load_report
from runtimes.encoder_batcher import Batcher, T
from runtimes.engines import Encoder, encoder_for
from runtimes.engines.encoder import EncoderEngine
from runtimes.generation.loader import GenerationRuntime
from runtimes.health import Health, State
from runtimes.metrics import Metrics
from runtimes.settings import Settings
from runtimes.startup import Timeline
from runtimes.tokenize import Pair, PairTokenizer, TextTokenizer

log = logging.getLogger("mbuild.runtime")


@dataclass
class EmbeddingRuntime:
    engine: Encoder
    tokenizer: TextTokenizer
    batcher: Batcher[list[int]]

    @classmethod
    def load(cls, model_dir: Path, config: EngineConfig, settings: Settings, metrics: Metrics) -> EmbeddingRuntime:
        engine = warm_encoder(model_dir, config, settings)
        return cls(engine, TextTokenizer(model_dir / config.tokenizer_file, config.max_seq_length),
                   batcher(engine.run, config, settings, metrics))


@dataclass
class RerankRuntime:
    """A cross-encoder: (query, passage) pairs batched into the encoder engine's scores."""

    engine: EncoderEngine
    tokenizer: PairTokenizer
    batcher: Batcher[Pair]

    @classmethod
    def load(cls, model_dir: Path, config: EngineConfig, settings: Settings, metrics: Metrics) -> RerankRuntime:
        engine = warm_encoder(model_dir, config, settings)
        return cls(engine, PairTokenizer.of_engine(model_dir, config),
                   batcher(engine.score, config, settings, metrics))


def warm_encoder(model_dir: Path, config: EngineConfig, settings: Settings) -> EncoderEngine:
    engine = encoder_for(model_dir, config, settings.threads)
    engine.warm_up()
    return engine


def batcher(run: Callable[[list[T]], np.ndarray], config: EngineConfig, settings: Settings,
            metrics: Metrics) -> Batcher[T]:
    """The batcher an encoder's runtime queues into: the plan's limits, unless the operator set others."""
    max_batch = settings.max_batch or config.batching.max_batch
    delay_ms = settings.max_batch_delay_ms
    delay_ms = config.batching.max_batch_delay_ms if delay_ms is None else delay_ms
    return Batcher(run, max_batch, settings.max_queue, metrics, delay_ms / 1000)


Runtime = EmbeddingRuntime | RerankRuntime | GenerationRuntime


@dataclass
class ServiceState:
    settings: Settings
    health: Health = field(default_factory=Health)
    metrics: Metrics = field(default_factory=Metrics)
    metadata: BundleMetadata | None = None
    report: GateReport | None = None
    config: EngineConfig | None = None
    embedding: EmbeddingRuntime | None = None
    ranking: RerankRuntime | None = None
    generation: GenerationRuntime | None = None
    timeline: Timeline = field(default_factory=Timeline.of_process)

    @property
    def in_flight(self) -> int:
        encoder = self.embedding or self.ranking
        if encoder is not None:
            return encoder.batcher.in_flight
        return self.generation.engine_loop.busy if self.generation is not None else 0

    def served_names(self) -> list[str]:
        """The name /v1/models lists first, then the other names a request may use for the model."""
        model = self.metadata.model if self.metadata else None
        names = [self.settings.served_name, *((model.repo, model.alias) if model else ())]
        return [n for n in dict.fromkeys(names) if n] or ["model"]

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load, warm up, then mark ready; on any failure mark failed with the reason."""
        try:
            self.health.move(State.LOADING)
            model_dir = self.settings.model_dir
            self.config = load_engine_config(model_dir)
            self.metadata = load_metadata(model_dir)
            self.report = load_report(model_dir)
            self.health.move(State.WARMING)
            runtime: Runtime
            if self.config.task == "embedding":
                runtime = EmbeddingRuntime.load(model_dir, self.config, self.settings, self.metrics)
            elif self.config.task == "rerank":
                runtime = RerankRuntime.load(model_dir, self.config, self.settings, self.metrics)
            else:
                runtime = GenerationRuntime.load(model_dir, self.config, self.settings, self.metrics, self.metadata)
                self.timeline.mark("engine")
                runtime.engine.warm_up()
            self.timeline.mark("warm-up")
            asyncio.run_coroutine_threadsafe(self._activate(runtime), loop).result()
        except Exception as exc:  # every failure becomes a failed state with a readable reason
            log.error("model failed to load: %s", exc)
            self.health.move(State.FAILED, str(exc))
            flag = self.settings.failed_flag
            if flag is not None:  # tells the supervisor (PID 1) to stop the server with a non-zero exit
                flag.parent.mkdir(parents=True, exist_ok=True)
                flag.write_text(str(exc))

    async def _activate(self, runtime: Runtime) -> None:
        # The batcher's task must live on the serving loop, so readiness flips there too.
        if isinstance(runtime, EmbeddingRuntime):
            runtime.batcher.start()
            self.embedding = runtime
        elif isinstance(runtime, RerankRuntime):
            runtime.batcher.start()
            self.ranking = runtime
        else:
            runtime.engine_loop.start()
            self.generation = runtime
        self.metrics.model_name = self.served_names()[0]
        self.health.move(State.READY)
        self.timeline.mark("ready")
        log.info("model ready: %s (%s)", ", ".join(self.served_names()), self.timeline.summary())

    def load_in_background(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        thread = threading.Thread(target=self.load, args=(loop,), name="model-loader", daemon=True)
        thread.start()
        return thread

