"""The BentoML service, run where MBUILD_TRACING=1 asks for BentoML's spans (runtimes/server.py serves otherwise):
BentoML runs the processes and the server; our ASGI app answers every route."""

from __future__ import annotations

import bentoml

from runtimes.api.app import create_app
from runtimes.logs import configure_logging
from runtimes.settings import Settings

settings = Settings.from_env()
configure_logging(settings)
app = create_app(settings)


# BentoML's own access log and metrics are off: the app logs every request once (with its request
# id, never its body) and serves richer metrics on /v1/metrics; doing both would pay twice per request.
# BentoML also opens an OpenTelemetry span per request, about a tenth of a small request's cost, kept
# only when MBUILD_TRACING=1 says an exporter is configured (BENTOML_CONFIG); otherwise no URL is traced.
TRACING = {} if settings.tracing else {"excluded_urls": [".*"]}


@bentoml.service(name="mbuild", workers=1, traffic={"timeout": 300}, logging={"access": {"enabled": False}},
                 metrics={"enabled": False}, tracing=TRACING)
@bentoml.asgi_app(app, path="/")
class ModelService:
    """Routes come from runtimes.api.app; BentoML adds its own /livez, /readyz and /metrics beside them."""
