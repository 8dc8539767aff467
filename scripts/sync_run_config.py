"""Rewrite [tool.flwr.app.config] in pyproject.toml from the run-config schema.

Run after adding or changing a key (a field of a ConfigView, or a Param of the data or
the privacy policy): python scripts/sync_run_config.py
(tests/test_config.py fails while the two differ)."""
import json, re, sys
sys.path.insert(0, '.')
from app import registry
lines = []
for k, p in registry.schema().params.items():
    v = p.default
    s = ('true' if v else 'false') if isinstance(v, bool) else json.dumps(v) if isinstance(v, str) else repr(v)
    lines.append(f'"{k}" = {s}')
text = open('pyproject.toml').read()
head = text[: text.index('[tool.flwr.app.config]\n') + len('[tool.flwr.app.config]\n')]
open('pyproject.toml', 'w').write(head + "\n".join(lines) + "\n")
