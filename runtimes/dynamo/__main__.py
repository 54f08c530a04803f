"""`python -m runtimes.dynamo`: this image as a Dynamo worker (engine.py); MBUILD_* settings as for the HTTP server."""

from dynamo.common.backend.run import run

from runtimes.dynamo.engine import MbuildEngine

if __name__ == "__main__":
    run(MbuildEngine)
