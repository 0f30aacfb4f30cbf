#!/usr/bin/env bash
# dlslime vs Open MPI vs Gloo vs torch's floor, through torch.distributed
# (bench/torch_dist_bench.py) and in the C core (bench/p2p_bench.py):
# installs Open MPI (Debian packages) and mpi4py if either is missing,
# builds the package and the C benchmarks, runs both (arguments go to
# torch_dist_bench.py, e.g. --quick --transport shm,tcp); CSVs and plots
# land in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev </dev/null
fi
python -c "import mpi4py" 2>/dev/null || pip install -q mpi4py
python setup.py -q build_ext --inplace >/dev/null
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python bench/p2p_bench.py --quick --csv bench/results/p2p_mpi.csv
exec python bench/torch_dist_bench.py "$@"
