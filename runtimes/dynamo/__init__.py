"""The image as an NVIDIA Dynamo worker and frontend (needs `mbuild package --with dynamo`); the names a deployment
runs them by, importable without Dynamo."""

WORKER_MODULE = "runtimes.dynamo"  # python3 -m: a worker (engine.py)
FRONTEND_MODULE = "runtimes.dynamo.frontend"  # python3 -m: Dynamo's frontend beside the image's model card
PLANES = ("--request-plane", "tcp", "--event-plane", "zmq")  # no NATS: requests over TCP, KV events over ZMQ
