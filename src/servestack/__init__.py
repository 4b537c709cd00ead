"""servestack: pins -> lock -> reproducible inference image -> gated results."""

__version__ = "0.1.0"
