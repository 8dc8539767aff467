"""``python -m app.report RUN_DIR``; the run's page itself is :mod:`fedgraphcore.report`."""
