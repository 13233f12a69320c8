import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@pytest.fixture
def configs() -> Path:
    return CONFIGS


def duopoly_config(**market_overrides) -> dict:
    """The logit duopoly scenario as a mapping (tests tweak it in place)."""
    import yaml
    config = yaml.safe_load((CONFIGS / "logit_duopoly.yaml").read_text())
    config["market"].update(market_overrides)
    return config


os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One JAX compilation cache for the whole test run, shared by the xdist workers and the
# CLI subprocesses the tests start (they inherit the environment), and used by the CLIs'
# own cache (jaxmarket/compile_cache.py; nothing is written to ~/.cache): a program that
# one test compiled (a run that another test resumes, a config that several files train)
# is loaded by the next instead of compiled again. A loaded program is the executable
# that was compiled, so every result is the same bits. The directory goes at the end.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile
    _TEST_CACHE: str | None = tempfile.mkdtemp(prefix="jaxmarket-test-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _TEST_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
    os.environ.setdefault("JAXMARKET_COMPILE_CACHE", _TEST_CACHE)
else:   # an xdist worker: the controller made it (or the caller chose one)
    _TEST_CACHE = None
    os.environ.setdefault("JAXMARKET_COMPILE_CACHE", os.environ["JAX_COMPILATION_CACHE_DIR"])


def pytest_sessionfinish(session, exitstatus):
    if _TEST_CACHE is not None and not hasattr(session.config, "workerinput"):
        import shutil
        shutil.rmtree(_TEST_CACHE, ignore_errors=True)


sys.path.insert(0, str(ROOT / "tests"))


# The long runs, marked slow here in one place (besides the full reproductions marked in
# their files): the README's test command leaves them out (`-m 'not slow'`) to stay
# within 15 minutes on 2 cores; `.ci/run` runs them right after it (`-m slow`), so CI
# runs every test. Here: the memory measurements (1 GB runs), the multi-process and
# multi-device runs, the Ctrl-C and kill resumes, the wheel install, the heaviest shipped
# configs and population runs, the learning reproductions, then every other test of 12 s
# or more (`pytest --durations`, 2026-12-03; docs/testing.md).
LONG = (
    "tests/test_reliability_memory.py::",
    "tests/test_cli.py::test_ctrl_c_checkpoints_the_chunk_prints_one_line_and_resumes_identically",
    "tests/test_qlearning.py::test_calvano_sessions_are_the_same_on_one_or_two_devices",
    "tests/test_distributed.py::test_two_processes_write_what_one_process_with_two_devices_writes",
    "tests/test_configs.py::test_every_shipped_config_trains[multi_product]",
    "tests/test_configs.py::test_every_shipped_config_trains[bench_b]",
    "tests/test_devices.py::test_markets_are_split_over_the_devices_and_policies_replicated",
    "tests/test_population.py::test_every_learner_kind_trains_under_league_and_a_custom_mapping",
    "tests/test_notebooks.py::test_notebook_runs_in_quick_mode[offline_rl]",
    "tests/test_ppo_grouped.py::",
    "tests/test_poi.py::test_bonus_reaches_the_bandit_policy_gradient_and_a_model_alone_changes_nothing",
    "tests/test_sweep.py::test_ray_backend_on_a_local_two_cpu_ray_equals_the_local_backend",
    "tests/test_packaging.py::test_wheel_ships_the_configs_and_the_command_and_trains_outside_the_checkout",
    "tests/test_train.py::test_resume_after_kill_is_bit_identical",
    "tests/test_poi_obs.py::test_rival_model_learns_a_constant_rival",
    # 13-27 s each: the population Latin square, learning runs, the PBT notebook
    "tests/test_population.py::test_every_learner_kind_trains_under_every_mapping",
    "tests/test_ppo.py::test_shared_policy_gets_all_gradients_and_the_other_none",
    "tests/test_ppo.py::test_learns_contextual_bandit_with_two_opposite_policies",
    "tests/test_notebooks.py::test_notebook_runs_in_quick_mode[populations_pbt]",
    "tests/test_offline_algos.py::test_td3_bc_and_discrete_cql_find_the_best_price",
    "tests/test_calvano_cli.py::test_three_firm_economics_match_a_scipy_solve",
    "tests/test_qlearning.py::test_reduced_calvano_is_supra_competitive",
    # 12-18 s each in the README command on 2026-12-03 (fresh clone: 14m42s with them)
    "tests/test_poi_obs.py::test_rival_model_targets_are_the_rivals_prices_of_the_rollout",
    "tests/test_notebooks.py::test_notebook_runs_in_quick_mode[quickstart]",
    "tests/test_configs.py::test_every_shipped_config_trains[poi_demand]",
    "tests/test_member_hyper.py::test_ppo_hyperparameters_per_policy_match_learners_built_with_those_values",
    "tests/test_poi.py::test_surprise_restarts_beta_and_the_heldout_error_is_against_the_true_demand",
    "tests/test_member_hyper.py::test_pbt_on_actor_critic_ppo_copies_parameters_and_adam_state",
    "tests/test_docs.py::test_python_block_runs_and_prints_what_its_comments_say[docs/learners/ppo.md:130]",
    "tests/test_poi.py::test_nan_model_loss_stops_the_run",
    "tests/test_notebooks.py::test_notebook_runs_in_quick_mode[calvano_collusion]",
    "tests/test_ppo.py::test_discrete_head_grid_prices_and_log_prob",
    "tests/test_ppo.py::test_each_policy_loss_is_the_mean_over_its_own_samples",
    # 16-60 s each in the README command on 2026-12-07 (fresh clone: 14m02s with them):
    # the reduced Hansen et al. runs (one 58 s module fixture), a reduced design through
    # the console command, the strict docs build
    "tests/test_reproductions_bandits.py::test_the_share_is_the_formula_applied_to_the_runs_recent_prices",
    "tests/test_reproductions_bandits.py::test_a_higher_signal_to_noise_ratio_gives_correlated_higher_prices",
    "tests/test_reproduce.py::test_a_reduced_design_through_the_console_command",
    "tests/test_docs_site.py::test_mkdocs_strict_build_has_every_page_and_the_api_reference",
    # 10-14 s each on 2026-12-07: end-to-end resumes and runs
    "tests/test_sessions_run.py::test_resume_after_sigkill_gives_the_same_files",
    "tests/test_sessions_run.py::test_a_design_no_config_holds_runs_on_the_session_engine",
    "tests/test_reliability_resume.py::test_a_checkpoint_of_another_shape_falls_back_with_nothing_on_stderr",
    "tests/test_reliability_resume.py::test_a_checkpoint_fallback_leaves_stderr_empty",
    "tests/test_cluster.py::test_a_head_that_does_not_answer_is_one_line_and_exit_1",
    "tests/test_configs.py::test_every_shipped_config_trains[calvano_ppo]",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(LONG):
            item.add_marker(pytest.mark.slow)
