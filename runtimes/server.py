"""The server process the supervisor runs (`python -m runtimes.server`): uvicorn serving runtimes/api/app.py, which
loads the model in the background and answers every route, its own timeouts included.

This was BentoML's `bentoml serve`: its arbiter (circus) imported the whole app to read the service, then started
a worker that imported it again and ran this same uvicorn; the two took 2.5 s of a 3.5 s start to ready
(docs/benchmarks/start_ready.md). BentoML's server still runs where MBUILD_TRACING=1 asks for its OpenTelemetry
spans (runtimes/service.py).
"""

from __future__ import annotations

import os

import uvicorn

from runtimes.api.app import create_app
from runtimes.logs import configure_logging
from runtimes.settings import Settings
from runtimes.startup import Timeline, now, started_at


def main() -> None:
    timeline = Timeline.of_process(os.getppid(), "the start")  # the supervisor's start
    timeline.mark("server process", started_at() or now())  # this process's start, from /proc
    timeline.mark("imports")
    settings = Settings.from_env()
    configure_logging(settings)
    app = create_app(settings, timeline)
    # As BentoML's worker ran it: its access log off (the app logs each request once), no Server header.
    uvicorn.run(app, host=settings.host, port=settings.port, backlog=2048, log_config=None, access_log=False,
                server_header=False, timeout_keep_alive=settings.keepalive_seconds,
                ssl_certfile=settings.ssl_certfile, ssl_keyfile=settings.ssl_keyfile)


if __name__ == "__main__":
    main()
