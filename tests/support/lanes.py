"""Which lane a test runs in. `make unit` runs the tests marked neither `processes` nor `slow`;
`make test` runs every test.

`processes`: the test starts processes — replicas, node agents, web servers, Celery, browsers,
Mooncake masters, a parallel group's ranks, redis-server or another Python. Every test under
tests/integration/ and tests/e2e/ does; elsewhere the entries of STARTS_PROCESSES say which
(found by recording what each test spawned). `slow`: a test that starts nothing but computes
for seconds on a 2-core CPU (SLOW); what the fast lane leaves out is covered by `make test`.

An entry names a test function, or a fixture (every test using it, directly or through another
fixture, is marked), or "*" (the whole module); "name[text]" only the parametrised cases whose
id holds `text`."""

from __future__ import annotations

from pathlib import Path

import pytest

PROCESS_FOLDERS = ("integration", "e2e")

STARTS_PROCESSES: dict[str, tuple[str, ...]] = {
    "test_deploy_files.py": ("test_dockerfiles_pass_hadolint", "test_systemd_units_cover_every_process_and_verify"),
    "test_kubernetes.py": ("*",),  # helm
    "test_run_supervisor.py": ("*",),
    "test_tooling.py": ("test_make_check_needs_no_database",),  # manage.py check, twice
    "controlplane/test_capacity_planner.py": ("test_planning_imports_neither_torch_nor_the_engine",),
    "controlplane/test_compatibility.py": ("test_the_table_reads_no_engine_module",),
    "controlplane/test_gateway_tokenization.py": ("test_the_web_process_tokenises_without_torch_or_the_engine",),
    "controlplane/test_hub_reconnect.py": ("*",),  # redis-server
    "controlplane/test_poison_budget.py": ("*",),  # a supervisor's fake replicas
    "controlplane/test_security.py": (
        "test_node_agent_makes_the_state_directory_private",
        "test_state_directory_and_its_files_are_owner_only",
    ),
    "controlplane/test_sqlite.py": ("*",),
    "controlplane/test_tool_calls.py": (
        "test_the_gateways_checks_load_no_torch_and_take_one_pass_over_a_large_schema",
    ),
    "engine/test_catalog_sync.py": ("test_web_process_does_not_import_torch",),
    "engine/test_deepseek_v3.py": (  # parallel groups
        "test_parallel_groups_match_transformers",
        "test_the_multi_token_prediction_layer_is_skipped",
        "test_a_rank_refuses_a_checkpoint_missing_part_of_its_share",
    ),
    "engine/test_feature_matrix.py": ("test_feature_pair[tp=2]",),
    "engine/test_loader.py": ("test_building_a_model_skips_its_random_initialisation",),
    "engine/test_parallel_group.py": (
        "test_a_rank_killed_mid_generation_fails_the_request_quickly",
        "test_killing_rank_0_leaves_no_rank_behind",
    ),
    "engine/test_parallel_parity.py": ("*",),
    "engine/test_parallel_speculative.py": ("*",),
    "engine/test_parallel_startup.py": ("*",),
    "engine/test_quantized.py": ("test_int4_experts_at_tensor_parallel_generate_what_one_device_does",),
    "engine/test_structured.py": ("test_an_engine_loads_xgrammar_only_for_its_first_grammar",),
    "engine/test_tiered_cache.py": ("master", "test_a_put_the_store_refused_is_tried_again"),  # mooncake_master
    "kvtiers/test_disk_tier.py": ("test_two_processes_share_one_budget",),
    "kvtiers/test_master.py": ("*",),
    "kvtiers/test_store_tier.py": ("*",),
    "support/test_services.py": ("test_a_second_run_gets_other_servers_and_leaves_nothing_behind",),
    "workers/test_agent_devices.py": ("test_discovering_devices_does_not_import_torch",),
    "workers/test_agent_kv_index.py": ("*",),  # a supervisor's fake replicas
    "workers/test_broker_guard.py": ("*",),
    "workers/test_layering.py": (
        "test_agent_and_protocol_load_without_django_or_the_database",
        "test_agent_worker_does_not_load_django_settings_even_when_told_where_they_are",
    ),
    "workers/test_outbox.py": ("*",),
    "workers/test_replica_kv_index.py": ("*",),
    "workers/test_sim_engine.py": ("test_the_sim_replica_loads_neither_torch_nor_the_model_code",),
    "workers/test_replica_speculation.py": ("*",),
    "workers/test_replica_tiers.py": ("*",),
}

# Each case about 2 s or more here (--durations, one run alone on the 2-core machine).
SLOW: dict[str, tuple[str, ...]] = {
    "controlplane/test_routing_policies.py": (
        "test_continued_keyless_conversations_move_off_a_replica_sent_too_many_on_every_seed",
        "test_a_key_walks_the_ring_from_its_own_point_and_every_replica_appears_once",
    ),
    "controlplane/test_schemathesis.py": ("test_management_api_conforms_to_its_openapi_schema",),  # 23 s
    "engine/test_deepseek_v3.py": (
        "test_greedy_tokens_and_logprobs_match_transformers",
        "test_ngram_speculation_is_lossless",
    ),
    "engine/test_eagle3.py": (
        "test_random_head_is_lossless_alone_together_and_under_preemption",  # 10 s a case
        "test_a_head_that_does_not_fit_its_target_is_refused",
        "test_a_head_with_its_own_embedding_uses_it",
        "test_the_trainer_writes_a_head_the_engine_loads",
        "test_a_head_that_missed_part_of_the_answer_does_not_draft",
        "test_demo_pair_is_lossless_and_accepts_most_drafts",
    ),
    "engine/test_parallel_sampling.py": (
        "test_preempted_samples_recompute_to_the_same_answers",
        "test_seeded_samples_reproduce_and_differ",
        "test_logit_bias_leaves_other_rows_of_the_batch_alone",
        "test_greedy_samples_all_equal_the_single_answer",
        "test_logit_bias_forces_and_bans_tokens",
    ),
    "engine/test_parity.py": ("test_greedy_tokens_and_logprobs_match_transformers",),
    "engine/test_quantized.py": (
        "test_quantized_checkpoint_generates_what_its_dequantized_twin_does",
        "test_quantized_mla_moe_checkpoints_generate_what_their_dequantized_twins_do",
    ),
    "engine/test_speculative_decode.py": (
        "test_eos_and_stop_token_inside_an_accepted_run",
        "test_greedy_is_lossless_under_preemption_and_chunked_prefill",
        "test_stop_string_ending_inside_an_accepted_run",
        "test_backoff_pauses_a_sequence_whose_drafts_fail",
        "test_prefix_cache_holds_only_accepted_tokens_kv",
        "test_greedy_is_lossless_alone_and_in_mixed_batches",
        "test_seeded_sampling_gives_the_same_tokens_as_without_speculation",
        "test_max_tokens_is_never_exceeded",
        "test_unseeded_sampling_is_reproducible_run_to_run",
        "test_context_end_is_never_exceeded",
        "test_stats_and_configuration",
        "test_speculation_switches_off_above_the_batch_threshold",
    ),
    "engine/test_speculation_cost_model.py": (
        "test_the_engine_drafts_per_step_as_the_batch_grows_and_shrinks",
        "test_auto_is_lossless_and_drafts_from_lookup_or_the_head",
    ),
    "engine/test_speculative_rejection.py": ("test_bad_draft_distribution_still_yields_the_target_distribution",),
    "engine/test_structured.py": (
        "test_free_requests_are_unchanged_by_constrained_neighbours_with_chunking_and_preemption",
    ),
}


def _matches(item: pytest.Item, entries: tuple[str, ...]) -> bool:
    case = item.callspec.id if hasattr(item, "callspec") else ""
    for entry in entries:
        name, _, text = entry.partition("[")
        named = name == "*" or name == item.originalname or name in item.fixturenames
        if named and text.rstrip("]") in case:
            return True
    return False


def mark(items: list[pytest.Item], tests_root: Path) -> None:
    """Mark `items` (pytest_collection_modifyitems) `processes` or `slow` as the tables say."""
    for item in items:
        if not item.path.is_relative_to(tests_root):
            continue
        relative = item.path.relative_to(tests_root)
        module = relative.as_posix()
        if relative.parts[0] in PROCESS_FOLDERS or _matches(item, STARTS_PROCESSES.get(module, ())):
            item.add_marker(pytest.mark.processes)
        if _matches(item, SLOW.get(module, ())):
            item.add_marker(pytest.mark.slow)


def heavy_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place, whole modules at a time: modules with a test that starts
    processes, then those with a slow one, then the rest, each group in collection order. Under
    `pytest -n` (as `make test` runs) the workers take modules in this order, so the long ones start first
    and the short ones fill in at the end, instead of a last stack running alone."""

    def weight(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("processes") else 1 if item.get_closest_marker("slow") else 2

    group: dict[Path, int] = {}
    for item in items:
        group[item.path] = min(group.get(item.path, 2), weight(item))
    items.sort(key=lambda item: group[item.path])  # stable: each module's tests keep their order
