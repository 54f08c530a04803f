"""Every module here is a `python -m bench` scenario of its own name (its docstring's first line is its --help line);
none imports another: what scenarios share lives in bench/lib/."""
