"""An elastic job on "dlslime": torchrun restarts it after a worker dies.

The test runs this file as the worker of
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 test_elastic.py --out DIR
On the first attempt (TORCHELASTIC_RESTART_COUNT 0) rank 1 SIGKILLs
itself in the middle of the job.  Rank 0, blocked in an all_reduce with
the dead rank, must fail by itself (the peer is gone, else the group's
time-out) and write down how; torchrun's agent only looks at its workers
every MONITOR_S seconds, far later, so a record from the survivor proves
it did not hang.  The agent then restarts both workers, and the second
attempt runs the whole job.  The test checks: the kill happened on the
first attempt, the survivor failed with a dlslime error, the second
attempt ran (a restart) and its all_reduce and send/recv results are
right on both ranks.
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time

import pytest

SIZE = 2
STEPS = 6
KILL_STEP = 3          # rank 1 dies entering this step, on the first attempt
GROUP_TIMEOUT_S = 5    # the bound on any collective of the job
MONITOR_S = 10         # torchrun's look at its workers: well after the bound

pytestmark = pytest.mark.timeout(300)


def expected_sum(step):
    return sum(rank + 1 + step for rank in range(SIZE))


def record(out_dir, what, rank, attempt, **data):
    path = os.path.join(out_dir, f"{what}-attempt{attempt}-rank{rank}.json")
    with open(path, "w") as f:
        json.dump(dict(rank=rank, attempt=attempt, **data), f)


def steps(rank, attempt, out_dir):
    """The job: STEPS all_reduces and a send/recv; returns the values seen."""
    import torch
    import torch.distributed as dist
    sums = []
    for step in range(STEPS):
        if attempt == 0 and rank == 1 and step == KILL_STEP:
            record(out_dir, "killed", rank, attempt, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        t = torch.full((4096,), float(rank + 1 + step))
        start = time.monotonic()
        try:
            dist.all_reduce(t)
        except Exception as exc:  # the survivor: say how, then fail
            record(out_dir, "survivor", rank, attempt, step=step, error=str(exc),
                   blocked_s=time.monotonic() - start)
            raise
        sums.append(t[0].item())
    peer = 1 - rank
    got = torch.empty(1 << 18)
    send = dist.isend(torch.full((1 << 18,), float(100 + rank)), peer)
    dist.recv(got, peer)
    send.wait()
    return sums, got[0].item()


def worker(out_dir):
    import torch
    import torch.distributed as dist
    import dlslime_torch  # noqa: F401  (registers the "dlslime" backend)
    torch.set_num_threads(1)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("dlslime", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    rank = dist.get_rank()
    sums, received = steps(rank, attempt, out_dir)
    dist.barrier()
    dist.destroy_process_group()
    record(out_dir, "done", rank, attempt, sums=sums, received=received)


def load(path):
    with open(path) as f:
        return json.load(f)


def test_restart_after_a_worker_is_killed(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(SIZE), "--max-restarts", "1",
           "--monitor-interval", str(MONITOR_S), os.path.abspath(__file__),
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    output = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{output}"

    files = sorted(p.name for p in tmp_path.iterdir())
    assert "killed-attempt0-rank1.json" in files, files
    survivor = load(tmp_path / "survivor-attempt0-rank0.json")
    assert survivor["step"] == KILL_STEP
    assert "dlslime" in survivor["error"], survivor
    for rank in range(SIZE):
        assert f"done-attempt0-rank{rank}.json" not in files, files
        done = load(tmp_path / f"done-attempt1-rank{rank}.json")
        assert done["sums"] == [expected_sum(step) for step in range(STEPS)], done
        assert done["received"] == float(100 + (1 - rank)), done


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the worker of the elastic test")
    parser.add_argument("--out", required=True, help="where the workers write their records")
    worker(parser.parse_args().out)
