"""Multi-process jobs for the torch-level tests.

run_job(world_size, fn, *args) starts world_size fresh processes (spawn:
nothing inherited from pytest).  The parent hosts a TCPStore on
127.0.0.1; each child connects to it and calls fn(rank, world_size,
store, *args), whose return value (picklable) comes back to the parent.
A rank that raises fails the job with its traceback; a rank still running
at the deadline is killed and fails it too, so no test can hang.
"""

import datetime
import multiprocessing
from multiprocessing import connection as mp_connection
import os
import time
import traceback

import torch.distributed as dist

JOB_TIMEOUT_S = 120
FAILURE_GRACE_S = 20
STORE_TIMEOUT = datetime.timedelta(seconds=60)


class JobFailed(AssertionError):
    pass


def _child(rank, size, port, fn, args, conn):
    try:
        # Two cores for all ranks: one intra-op thread each.
        import torch
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=STORE_TIMEOUT)
        result = fn(rank, size, store, *args)
        conn.send(("done", result))
    except BaseException:  # report everything, SystemExit included
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _collect(procs, conns, timeout, may_exit):
    """Waits for every rank's result or death.  Once one rank has failed
    the others get FAILURE_GRACE_S to finish (they may be blocked on the
    failed one until a timeout of theirs)."""
    size = len(procs)
    deadline = time.monotonic() + timeout
    results, errors = [None] * size, []
    pending = {conn: rank for rank, conn in enumerate(conns)}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for conn in mp_connection.wait(list(pending), timeout=left):
            rank = pending.pop(conn)
            try:
                kind, value = conn.recv()
            except EOFError:  # died without a word
                procs[rank].join(5)
                if rank not in may_exit:
                    errors.append(f"rank {rank}: exited with code "
                                  f"{procs[rank].exitcode} without a result")
                continue
            if kind == "error":
                errors.append(f"rank {rank} raised:\n{value}")
            else:
                results[rank] = value
        if errors:
            deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
    for rank in sorted(pending.values()):
        if rank not in may_exit:
            errors.append(f"rank {rank}: no result within the time allowed "
                          f"({timeout} s, or {FAILURE_GRACE_S} s after "
                          f"another rank failed); killed")
    return results, errors


def run_job(size, fn, *args, timeout=JOB_TIMEOUT_S, may_exit=(), env=None):
    """Runs fn in size processes; returns their results in rank order.

    may_exit: ranks allowed to end without a result (a test that kills
    one).  env: extra environment variables for the children.
    """
    mp = multiprocessing.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True,
                          wait_for_workers=False, timeout=STORE_TIMEOUT)
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    procs, conns = [], []
    try:
        for rank in range(size):
            parent_end, child_end = mp.Pipe(duplex=False)
            p = mp.Process(target=_child, name=f"{fn.__name__}[{rank}]",
                           args=(rank, size, store.port, fn, args, child_end))
            p.start()
            child_end.close()
            procs.append(p)
            conns.append(parent_end)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results, errors = _collect(procs, conns, timeout, may_exit)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
    if errors:
        raise JobFailed("\n".join(errors))
    return results
