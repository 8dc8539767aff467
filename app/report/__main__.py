"""``python -m app.report RUN_DIR``: write a run's report.html again from its folder."""

import sys

from app.report import main

sys.exit(main())
