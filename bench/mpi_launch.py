"""How the benchmarks start Open MPI jobs: the transports as issue 17
compares them, the root permission Open MPI asks for, and a plain word
when MPI is missing.  Used by torch_dist_bench.py (mpi4py ranks) and
p2p_bench.py (bench/mpi_bench.c)."""
from __future__ import annotations

import importlib.util
import os
import shutil

# Open MPI's ob1 messaging layer over shared memory (vader, with CMA
# single copies) or over TCP on loopback.
TRANSPORT_MCA = {
    "shm": ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"],
    "tcp": ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"],
}
INSTALL = ("apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py "
           "(bench/run_dist_bench.sh does both)")


def missing(tools=("mpirun",), modules=("mpi4py",)) -> str | None:
    """Why MPI cannot be measured here (None if it can)."""
    lacks = [t for t in tools if not shutil.which(t)]
    lacks += [m for m in modules if not importlib.util.find_spec(m)]
    return f"{' and '.join(lacks)} not found: {INSTALL}" if lacks else None


def mpirun(world: int, transport: str, bind: str) -> list[str]:
    """The start of an mpirun command line; the program and its arguments follow."""
    return ["mpirun", "-np", str(world), "--oversubscribe", "--bind-to", bind,
            *TRANSPORT_MCA[transport]]


def env() -> dict:
    """The environment for mpirun: as root, Open MPI wants both flags."""
    e = dict(os.environ)
    if os.geteuid() == 0:
        e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return e
