"""``python -m app.data.prepare``: cut a dataset into one file per party (:mod:`fedgraphcore.data.prepare`)."""

import sys

from fedgraphcore.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
