"""The engine's settings are defined once (native_engine/config.py): `bench serve`'s options, the flags a
deployment hands its replicas and the docs' flag table are generated from them."""

from pathlib import Path

import typer
from typer.testing import CliRunner

from native_engine.__main__ import app
from native_engine.cli import serve
from native_engine.config import (
    CacheAwareConfig,
    DeploymentConfig,
    EngineConfig,
    SchedulerConfig,
    ServeConfig,
    ServerConfig,
    SpeculativeConfig,
    flags_table,
    from_flags,
    serve_flags,
)
from native_engine.deployment import replica_args

DOCS = Path(__file__).resolve().parent.parent / "docs" / "engine.md"


def parse_serve(args: list[str]) -> dict:
    """{parameter: value} as `bench serve` reads args."""
    one = typer.Typer()
    one.command()(serve)
    return typer.main.get_command(one).make_context("serve", args).params


def test_the_docs_flag_table_is_the_settings_table():
    assert flags_table() in DOCS.read_text(encoding="utf-8"), (
        "docs/engine.md's flag table drifted from native_engine/config.py: "
        "run `python -m native_engine.config docs/engine.md`"
    )


def test_serve_has_one_option_per_setting_and_its_defaults_are_the_dataclasses():
    params = parse_serve([])
    assert list(params) == [flag.param for flag in serve_flags()]
    assert from_flags(params) == ServeConfig()
    # the spellings that differ from the field names, which scenarios' launch args use
    assert params["block_size"] == EngineConfig().kv_block_size
    assert params["no_prefix_caching"] is False and params["blas_threads"] == 0 and params["speculative"] is None


def test_a_replica_gets_back_the_settings_it_was_given():
    settings = ServeConfig(
        EngineConfig(
            model="some.gguf",
            kv_block_size=8,
            enable_prefix_caching=False,
            enable_jump_forward=False,
            cuda_graphs=False,
            step_trace=True,
            scheduler=SchedulerConfig(max_num_seqs=3, enable_chunked_prefill=False, schedule_policy="lpm"),
            speculative=SpeculativeConfig(num_speculative_tokens=2, ngram_min=1),
        ),
        ServerConfig(host="0.0.0.0", port=9000, shutdown_grace_s=3.5),
        DeploymentConfig(data_parallel=2, cache_aware=CacheAwareConfig(cache_threshold=0.25)),
    )
    replica = from_flags(parse_serve(replica_args(settings)))
    assert replica.engine == settings.engine
    assert replica.server.shutdown_grace_s == 3.5
    # the deployment's own settings stay with the router
    assert (replica.server.host, replica.server.port, replica.deployment) == ("127.0.0.1", 8000, DeploymentConfig())


def test_without_speculative_the_replicas_draft_nothing():
    args = replica_args(ServeConfig())
    assert "--speculative" not in args and from_flags(parse_serve(args)).engine.speculative is None


def test_a_bad_flag_value_is_named_before_anything_starts():
    bad_policy = CliRunner().invoke(app, ["serve", "--schedule-policy", "fifo"])
    assert bad_policy.exit_code == 2
    assert "schedule_policy: must be one of fcfs, lpm, not 'fifo'" in bad_policy.output
    # a deployment's bad engine setting stops the deployment, not each replica after it started
    bad_k = CliRunner().invoke(
        app, ["serve", "--data-parallel", "2", "--speculative", "ngram", "--num-speculative-tokens", "0"]
    )
    assert bad_k.exit_code == 2 and "--num-speculative-tokens: must be in [1, 16], got 0" in bad_k.output
    bad_range = CliRunner().invoke(app, ["serve", "--data-parallel", "0"])
    assert bad_range.exit_code == 2 and "--data-parallel" in bad_range.output
