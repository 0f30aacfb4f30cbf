#!/usr/bin/env bash
# SlimeRPC vs Ray 2.58.0 vs torch.distributed.rpc: installs Ray if it is
# missing (pinned), builds the package in place, runs bench/rpc_bench.py
# (arguments passed on, e.g. --quick), CSVs and a plot in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import ray, sys; sys.exit(ray.__version__ != '2.58.0')" 2>/dev/null; then
    pip install "ray==2.58.0"
fi
python setup.py -q build_ext --inplace >/dev/null
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python bench/rpc_bench.py "$@"
