#!/usr/bin/env bash
# SlimeRPC vs Ray 2.58.0 vs torch.distributed.rpc vs Pulsing 0.1.2:
# installs the pinned peers if they are missing, builds the package in
# place, runs bench/rpc_bench.py (arguments passed on, e.g. --quick),
# CSVs and a plot in bench/results/.  As root it also makes two network
# namespaces for the tcp part (bench/rpc_bench.py --no-netns skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
pinned() { python -c "import $1, sys; sys.exit($1.__version__ != '$2')" 2>/dev/null; }
pinned ray 2.58.0 || pip install "ray==2.58.0"
pinned pulsing 0.1.2 || pip install "pulsing==0.1.2"
python setup.py -q build_ext --inplace >/dev/null
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python bench/rpc_bench.py "$@"
