"""Training: state, steps, loop, checkpoints and metrics."""
