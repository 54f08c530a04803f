"""Text generation: sampling, stop handling, detokenization, chat templates, and the scheduler."""
