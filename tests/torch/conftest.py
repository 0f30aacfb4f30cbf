"""Shared pytest setup for the torch-level tests (torch.distributed
backend "dlslime").

The in-tree package comes first on sys.path, so the tests exercise this
checkout; the test directory is on it too, so spawned ranks can import
the helper modules and the test modules' rank functions.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)
