"""kernelcast's user-facing tools, under the project's own name so that they cannot clash with other packages.

``kernelcast.autotune``: a forecast-ranked config pruner for ``@triton.autotune``.
"""
