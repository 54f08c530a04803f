"""A ZMQ relay for the KV events of `mbuild serve --replicas`, on loopback.

In Dynamo's direct ZMQ mode every publisher (each worker's KV events, its load, the router's sequence events) binds a
socket on every interface (`tcp://0.0.0.0:0`; DYN_EVENT_PLANE_HOST changes only the address it advertises), which
would put listeners beyond `--host`. In Dynamo's broker mode (DYN_ZMQ_BROKER_URL) publishers and subscribers connect
to an XSUB/XPUB relay instead, so this one, bound to 127.0.0.1 in the serving process, is the only event listener.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

LOOPBACK = "tcp://127.0.0.1"


@contextmanager
def event_broker() -> Iterator[str]:
    """Run the relay while the block runs; yields the DYN_ZMQ_BROKER_URL value that points Dynamo at it."""
    import zmq  # the dynamo extra's, which serve_replicas has checked: `mbuild serve` without it must still start

    context = zmq.Context()
    xsub, xpub = context.socket(zmq.XSUB), context.socket(zmq.XPUB)
    xsub_port, xpub_port = xsub.bind_to_random_port(LOOPBACK), xpub.bind_to_random_port(LOOPBACK)

    def relay() -> None:
        try:
            zmq.proxy(xsub, xpub)
        except zmq.ContextTerminated:  # the block ended: context.term() below
            pass
        finally:
            xsub.close(linger=0)
            xpub.close(linger=0)
    thread = threading.Thread(target=relay, name="mbuild-event-broker", daemon=True)
    thread.start()
    try:
        yield f"xsub={LOOPBACK}:{xsub_port} , xpub={LOOPBACK}:{xpub_port}"
    finally:
        context.term()
        thread.join(timeout=5)
