"""mbuild's build side: everything that runs on the build host."""


def __getattr__(name: str) -> str:
    """`__version__`, read on first use: importlib.metadata costs ~35 ms of a process's start, and `mbuild serve`
    never reads it."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("mbuild")
    except PackageNotFoundError:  # a plain checkout on sys.path
        found = "0.0.0+checkout"
    globals()["__version__"] = found
    return found
