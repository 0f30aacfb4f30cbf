"""Shared pytest setup for the adversarial suite.

The in-tree package comes first on sys.path, and so do this directory and
tests/python (its two-process harness, c_peer.py), so processes started
with the spawn method import the same modules as the test.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (os.path.join(ROOT, "tests", "python"), HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)
