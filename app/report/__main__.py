"""``python -m app.report RUN_DIR``: write a run's report.html again from its folder."""

import sys

from app import registry
from fedgraphcore.report import main

if __name__ == "__main__":
    sys.exit(main(summaries={name: entry.strategy.summary for name, entry in registry.STRATEGIES.items()}))
