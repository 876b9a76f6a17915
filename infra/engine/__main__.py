"""``python -m kernelcast.infra.engine``: serve a model (``kernelcast.infra.engine.server.main``)."""

import sys

from kernelcast.infra.engine.server import main

sys.exit(main())
