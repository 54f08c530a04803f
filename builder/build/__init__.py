"""The pipeline that runs the stages: options, plan, reuse, lock, the build directory, the context."""
