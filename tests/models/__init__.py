"""Real model architectures the tests build themselves (no downloads, no torch)."""
