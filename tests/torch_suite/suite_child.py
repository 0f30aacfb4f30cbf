"""One run of torch's distributed_test.py for one backend and world size,
laid out as torch's test/distributed/test_distributed_spawn.py runs it for
Gloo: the test class is TestDistBackend (file:// init, a Barrier in
TEMP_DIR) plus DistributedTest._DistTestBase, each test starting its own
ranks.  The ranks are forked, not spawned: a spawned rank re-imports torch
and the 11,000-line suite, 15-25 s per test on a loaded two-core machine
against well under a second forked, which is what keeps the stage to
minutes.  Forking is safe here: this process only lists and starts tests,
it never makes a dlslime context nor runs a collective.

    BACKEND=dlslime|gloo WORLD_SIZE=N TEMP_DIR=DIR \\
        python suite_child.py --out RESULT.json [--gloo-skips GLOO.json] NAME...

run_suite.py starts it (one process per backend and world size, since
the suite reads $BACKEND when it is imported) and reads RESULT.json:
{"outcomes": {name: [outcome, detail]}, "skips": {name: reason or null},
 "gpu": [name], "lifted": {name: gate}}.
"""

import argparse
import json
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import torch  # noqa: E402
import dlslime_torch  # noqa: E402,F401  (registers the "dlslime" backend)
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

import gates  # noqa: E402

Base = DistributedTest._DistTestBase


class TestDistBackendWithFork(TestDistBackend, Base):
    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


class _Outcomes(unittest.TestResult):
    """Keeps one (outcome, detail) per test: passed, failed, skipped."""

    def __init__(self):
        super().__init__()
        self.outcomes = {}
        self._started = {}

    @staticmethod
    def _name(test):
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test):
        super().startTest(test)
        self._started[self._name(test)] = time.monotonic()
        print(f"  {self._name(test)} ...", end=" ", flush=True)

    def _record(self, test, outcome, detail=""):
        name = self._name(test)
        took = time.monotonic() - self._started.get(name, time.monotonic())
        self.outcomes[name] = [outcome, detail]
        print(f"{outcome} ({took:.1f} s)", flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self.failures[-1][1])

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self.errors[-1][1])

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "failed", "marked expectedFailure by torch")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the results go (JSON)")
    parser.add_argument("--gloo-skips", help="the Gloo run's result, for dlslime's gates")
    parser.add_argument("names", nargs="*", help="tests to run (none: only list the gates)")
    args = parser.parse_args()

    lifted = {}
    if os.environ["BACKEND"] != "gloo":
        if not args.gloo_skips:
            parser.error("a backend other than gloo needs --gloo-skips (the Gloo run's result)")
        with open(args.gloo_skips) as f:
            lifted = gates.gloo_like(Base, json.load(f)["skips"])
    tests = [name for name in dir(Base) if name.startswith("test_")]
    skips = {name: gates.skip_reason(getattr(Base, name)) for name in tests}
    gpu = [name for name in tests if gates.needs_gpu(getattr(Base, name))]
    result = _Outcomes()
    unittest.TestSuite(TestDistBackendWithFork(name) for name in args.names).run(result)
    with open(args.out, "w") as f:
        json.dump({"outcomes": result.outcomes, "skips": skips, "gpu": gpu,
                   "lifted": lifted}, f)


if __name__ == "__main__":
    main()
