"""primforge: custom JAX operators made first-class."""

__version__ = "0.1.0"
