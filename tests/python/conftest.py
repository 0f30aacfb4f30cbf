"""Shared pytest setup for the Python tests.

The in-tree package (dlslime_torch with its built _C and libdlslime.so)
is put first on sys.path, so the tests exercise this checkout; the test
directory is on it too, so processes started with the spawn method can
import the helper modules and the test modules' peer functions.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

# $DLSLIME_TEST_TRANSPORTS (comma list) narrows or widens this: the verbs
# stage runs the tests with "verbs" inside the soft-RoCE VM.
TRANSPORTS = tuple(t for t in os.environ.get("DLSLIME_TEST_TRANSPORTS", "shm,tcp").split(",") if t)


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    """Every Context a test makes uses this transport (Context(transport=))."""
    return request.param
