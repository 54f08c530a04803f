"""mbuild's serving side: runs inside the container. Never imports `builder`."""

__version__ = "0.1.0"
