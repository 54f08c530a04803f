"""mbuild's serving side: runs inside the container. Never imports `builder`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mbuild")
except PackageNotFoundError:  # inside an image the runtime is copied, not installed: metadata.json names the build
    __version__ = "0.0.0+copy"
