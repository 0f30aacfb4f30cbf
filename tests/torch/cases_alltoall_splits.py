"""Catalog cases: all_to_all_single with every form of splits (equal,
uneven input splits, uneven output splits, both), against Gloo (see
cases.py)."""

import torch
import torch.distributed as dist

from cases import case, data, same

# rows(src, dst): rows rank src sends to rank dst; which split lists are
# passed (the other side is then split evenly, so the form keeps it even).
FORMS = {
    "equal": (lambda src, dst: 2, False, False),
    "uneven-input": (lambda src, dst: dst + 1, True, False),
    "uneven-output": (lambda src, dst: src + 1, False, True),
    "uneven-both": (lambda src, dst: (2 * src + dst) % 3, True, True),
}


def _form_case(form):
    @case(f"all_to_all_single-{form}")
    def run(env):
        rows, give_in, give_out = FORMS[form]
        in_splits = [rows(env.rank, p) for p in range(env.size)]
        out_splits = [rows(p, env.rank) for p in range(env.size)]
        for dtype, tail in ((torch.float32, (2, 3)), (torch.int8, ())):
            x = data(f"a2a{form}{dtype}", env.rank, (sum(in_splits), *tail), dtype)
            ref = torch.empty(sum(out_splits), *tail, dtype=dtype)
            got = torch.empty(sum(out_splits), *tail, dtype=dtype)
            splits = (out_splits if give_out else None, in_splits if give_in else None)
            dist.all_to_all_single(ref, x, *splits, group=env.gloo)
            dist.all_to_all_single(got, x, *splits)
            same(got, ref, what=f"all_to_all_single {form} {dtype}")
            # A non-contiguous input goes through a copy.
            if tail:
                got = torch.empty_like(got)
                dist.all_to_all_single(got, x.transpose(1, 2).contiguous().transpose(1, 2), *splits)
                same(got, ref, what=f"all_to_all_single {form}, non-contiguous input")


for _form in FORMS:
    _form_case(_form)
