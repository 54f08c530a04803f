"""`python -m builder.cli`, the same as the `mbuild` command."""

from builder.cli import main

main()
