"""mbuild's build side: everything that runs on the build host."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mbuild")
except PackageNotFoundError:  # a plain checkout on sys.path
    __version__ = "0.0.0+checkout"
