"""`python3 -m runtimes.dynamo.frontend ARGS`: Dynamo's frontend (`python3 -m dynamo.frontend ARGS`) in a container
of this image that runs no worker (a DynamoGraphDeployment's Frontend pod, or `docker run` beside worker containers).

The frontend reads a worker's model card from the path the worker registered when that path is visible to it
(Dynamo's rule for local models: the same files at the same path on every node). The card is written from the
image's model folder and named by its content (card.py), so this writes the very folder each worker of the image
registered, then starts the frontend in this process.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path

from runtimes.bundle import load_engine_config
from runtimes.dynamo.card import write_card
from runtimes.settings import Settings


def main(argv: list[str]) -> None:
    model_dir = Settings.from_env().model_dir
    write_card(model_dir, load_engine_config(model_dir), Path(tempfile.gettempdir()))
    sys.argv = ["dynamo.frontend", *argv]
    runpy.run_module("dynamo.frontend", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
