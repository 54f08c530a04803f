"""The build stages, each a small module: pull, export, compile, validate, context, image."""
