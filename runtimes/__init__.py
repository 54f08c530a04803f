"""mbuild's serving side: runs inside the container. Never imports `builder`."""


def __getattr__(name: str) -> str:
    """`__version__`, read on first use: importlib.metadata costs ~35 ms of a process's start, and of the runtime's
    processes only the server reads it."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("mbuild")
    except PackageNotFoundError:  # inside an image the runtime is copied, not installed: metadata.json names the build
        found = "0.0.0+copy"
    globals()["__version__"] = found
    return found
