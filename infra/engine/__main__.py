"""``python -m infra.engine``: serve a model (``infra.engine.server.main``)."""

import sys

from infra.engine.server import main

sys.exit(main())
