"""What the stage runs, and what it expects dlslime to fail for now.

SELECTION is by name and the same for both backends and both world sizes:
torch's tests that apply to a CPU backend (those Gloo runs on a machine
without a GPU; run_suite.py --all runs every one of them), less
variants that only repeat a path already selected (the profiler-wrapped
send/recv, min/max/product next to sum) and the "_group" tests, which
torch skips below 8 ranks, so that the whole stage keeps to about four
minutes on a two-core machine.
"""

SELECTION = (
    # job and group bookkeeping
    "test_Backend_enum_class", "test_get_backend", "test_get_rank",
    "test_get_rank_size_full_group", "test_get_rank_size_group",
    "test_destroy_full_group", "test_destroy_group",
    "test_dump_DDP_relevant_env_vars",
    # point to point
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source",
    "test_isend", "test_irecv", "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags", "test_send_recv_torch_profiler",
    "test_send_recv_any_source_torch_profiler",
    # broadcast, reduce, all_reduce
    "test_broadcast", "test_broadcast_full_group",
    "test_reduce_sum", "test_reduce_max", "test_reduce_min", "test_reduce_product",
    "test_reduce_sum_twice", "test_reduce_full_group_sum",
    "test_all_reduce_sum", "test_all_reduce_max", "test_all_reduce_min",
    "test_all_reduce_product", "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_sum", "test_all_reduce_full_group_max",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_product", "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_sparse_all_reduce_sum",
    # gather, scatter, all_gather
    "test_gather", "test_gather_checks", "test_gather_full_group",
    "test_scatter", "test_scatter_checks", "test_scatter_complex",
    "test_scatter_full_group", "test_scatter_object_list",
    "test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_full_group", "test_all_gather_coalesced_with_empty",
    # barriers and time-outs
    "test_barrier", "test_barrier_full_group", "test_barrier_timeout_full_group",
    # DDP on CPU
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad", "test_ddp_logging_data_cpu",
    "test_grads_same_across_ranks_with_no_sync", "test_static_graph_api_cpu",
)

# Tests that pass on Gloo and fail on dlslime, with the reason: the stage
# fails on any other such test.
EXPECTED_FAILURES = {
    "test_ddp_logging_data_cpu": "torch's DDP logger records a third-party "
                                 "backend's name as 'custom' (the process "
                                 "group's backend type), the test expects "
                                 "the registered name 'dlslime'",
}
