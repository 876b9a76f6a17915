"""kernelcast: find fast GPU kernels while paying for as few GPU measurements as possible.

Installing kernelcast adds one import name, ``kernelcast``. Its parts are the repository's
top-level folders, each a subpackage, lowest layer first:

- ``kernelcast.kernels``: operations, candidates, template spaces, the measurement harness, hardware;
- ``kernelcast.surrogate``: forecasting a candidate's speedup and how sure it is (bins, forecasters,
  calibration, policies, training);
- ``kernelcast.storage``: Parquet tables under one data-root URI (a local folder or s3://), tracking;
- ``kernelcast.infra``: Ray actor pools, the single-machine executor, service launchers, models;
- ``kernelcast.tasks``: the search loop's five steps and the search state;
- ``kernelcast.flows``: Prefect flows, the command line, deployments;
- ``kernelcast.autotune``: a forecast-ranked config pruner for ``@triton.autotune``.

The folders carry no ``__init__.py`` of their own, so none of them is importable under its bare
name: a Python started in the repository's root still finds Hugging Face's ``kernels`` (which
transformers imports) and any other package of those names.
"""

import os as _os

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_ROOT = _os.path.dirname(_HERE)
# A wheel installs the subpackages inside this folder; a source checkout keeps them beside it, at the
# repository's root (the design card's layout), where this makes them found without an install.
if not _os.path.isdir(_os.path.join(_HERE, "kernels")) and _os.path.isdir(_os.path.join(_ROOT, "kernels", "harness")):
    __path__.append(_ROOT)  # noqa: F821 (a package's __path__)
