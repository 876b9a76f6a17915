"""The ``kernelcast`` command groups, one module each, every one with ``register(subparsers)``."""
