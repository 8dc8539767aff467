"""``python -m app.data.check``: check a party's data before a run (:mod:`fedgraphcore.data.check`)."""

import sys

from fedgraphcore.data.check import main

if __name__ == "__main__":
    sys.exit(main())
