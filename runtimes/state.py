"""What the service holds while it runs: settings, health, metrics, and (once loaded) the engine."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from runtimes.batcher import Batcher
from runtimes.bundle import EngineConfig, load_engine_config, load_metadata
from runtimes.engines import ENGINES, Engine
from runtimes.health import Health, State
from runtimes.metrics import Metrics
from runtimes.settings import Settings
from runtimes.tokenize import TextTokenizer

log = logging.getLogger("mbuild.runtime")


@dataclass
class Loaded:
    engine: Engine
    tokenizer: TextTokenizer
    batcher: Batcher


@dataclass
class ServiceState:
    settings: Settings
    health: Health = field(default_factory=Health)
    metrics: Metrics = field(default_factory=Metrics)
    metadata: dict[str, Any] = field(default_factory=dict)
    config: EngineConfig | None = None
    loaded: Loaded | None = None

    def served_names(self) -> list[str]:
        """The name /v1/models lists first, then the other names a request may use for the model."""
        model = self.metadata.get("metadata", {}).get("model", {})
        names = [self.settings.served_name, model.get("repo"), model.get("alias")]
        return [n for n in dict.fromkeys(names) if n] or ["model"]

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load, warm up, then mark ready; on any failure mark failed with the reason."""
        try:
            self.health.move(State.LOADING)
            model_dir = self.settings.model_dir
            self.config = load_engine_config(model_dir)
            self.metadata = load_metadata(model_dir)
            factory = ENGINES.get(self.config.engine)
            if factory is None:
                raise ValueError(f"engine {self.config.engine!r} is not one of {sorted(ENGINES)}")
            engine = factory(model_dir, self.config, self.settings.threads)
            tokenizer = TextTokenizer(model_dir / self.config.tokenizer_file, self.config.max_seq_length)
            self.health.move(State.WARMING)
            engine.warm_up()
            max_batch = int(self.config.options.get("max_batch", 32))
            batcher = Batcher(engine.run, max_batch, self.settings.max_queue, self.metrics)
            asyncio.run_coroutine_threadsafe(self._activate(Loaded(engine, tokenizer, batcher)), loop).result()
        except Exception as exc:  # every failure becomes a failed state with a readable reason
            log.error("model failed to load: %s", exc)
            self.health.move(State.FAILED, str(exc))

    async def _activate(self, loaded: Loaded) -> None:
        # The batcher's task must live on the serving loop, so readiness flips there too.
        loaded.batcher.start()
        self.loaded = loaded
        self.health.move(State.READY)
        log.info("model ready: %s", ", ".join(self.served_names()))

    def load_in_background(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        thread = threading.Thread(target=self.load, args=(loop,), name="model-loader", daemon=True)
        thread.start()
        return thread
