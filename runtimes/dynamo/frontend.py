"""`python3 -m runtimes.dynamo.frontend ARGS`: Dynamo's frontend (`python3 -m dynamo.frontend ARGS`) in a container
of this image that runs no worker (a DynamoGraphDeployment's Frontend pod, or `docker run` beside worker containers).

The frontend reads a worker's model card from the path the worker registered when that path is visible to it
(Dynamo's rule for local models: the same files at the same path on every node). The card is written from the
image's model folder and named by its content (card.py), so this writes the very folder each worker of the image
registered, then starts the frontend in this process.

Dynamo's KV router picks the worker with the least prompt blocks to prefill plus blocks its running sequences hold,
the two weighed 1:1 by default, as on a GPU. On a CPU engine (ONNX Runtime) a prompt block's prefill runs every
weight for 16 tokens while a running sequence's blocks cost only their attention reads, so by default the frontend of
a CPU image weighs prefill CPU_PREFILL_LOAD_SCALE times (DYN_ROUTER_PREFILL_LOAD_SCALE, Dynamo's own; an operator's
value of it, or --router-prefill-load-scale, wins). Measured on two CPU replicas (docs/benchmarks/routing.md): at 1:1
a conversation's turns bounced off the replica holding them whenever it ran one more sequence.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path

from runtimes.bundle import EngineConfig, load_engine_config
from runtimes.dynamo.card import write_card
from runtimes.settings import Settings, export_default

CPU_PREFILL_LOAD_SCALE = 16  # routing.md: scales 4, 16 and 64 measured beside Dynamo's 1; 16 and 64 alike, 4 short


def router_defaults(config: EngineConfig) -> dict[str, str]:
    """Dynamo's router variables this engine wants where the operator set none."""
    return {"DYN_ROUTER_PREFILL_LOAD_SCALE": str(CPU_PREFILL_LOAD_SCALE)} if config.engine == "onnxruntime" else {}


def main(argv: list[str]) -> None:
    model_dir = Settings.from_env().model_dir
    config = load_engine_config(model_dir)
    write_card(model_dir, config, Path(tempfile.gettempdir()))
    for name, value in router_defaults(config).items():
        export_default(name, value)
    sys.argv = ["dynamo.frontend", *argv]
    runpy.run_module("dynamo.frontend", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
