"""Starting and stopping engines: default command lines, and every bad launch gives a clear error
with the engine's log and leaves no process of its group behind."""

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from backends import load_backend
from backends.base import Backend
from harness.engine.launcher import BackendUnreachable, engine_command, group_alive, launch
from harness.scenario.scenario import LaunchConfig

GT_SERVER = Path(__file__).parent / "groundtruth_server.py"


@pytest.mark.parametrize(
    "kind, expected",
    [
        (
            "vllm",
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--host",
                "127.0.0.1",
                "--port",
                "8123",
                "--model",
                "M",
            ],
        ),
        (
            "sglang",
            [
                sys.executable,
                "-m",
                "sglang.launch_server",
                "--model-path",
                "M",
                "--host",
                "127.0.0.1",
                "--port",
                "8123",
                "--enable-metrics",
            ],
        ),
        ("trtllm", ["trtllm-serve", "M", "--host", "127.0.0.1", "--port", "8123"]),
        (
            "llamacpp",
            ["llama-server", "--host", "127.0.0.1", "--port", "8123", "-m", "M", "--metrics", "--cont-batching"],
        ),
        (
            "llamacpp_python",
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                "M",
                "--host",
                "127.0.0.1",
                "--port",
                "8123",
                "--interrupt_requests",
                "False",
            ],
        ),
        ("ollama", ["ollama", "serve"]),
        ("native", [sys.executable, "-m", "native_engine", "serve", "--host", "127.0.0.1", "--port", "8123"]),
    ],
)
def test_default_command_lines(kind, expected):
    assert engine_command(load_backend(kind), LaunchConfig(), 8123, "M") == expected


def test_command_args_and_placeholders():
    config = LaunchConfig(command="srv --port {port} -m '{model}'", args=["-t", 2, "--host={host}"])
    assert engine_command(load_backend("vllm"), config, 9, "a b") == [
        "srv",
        "--port",
        "9",
        "-m",
        "a b",
        "-t",
        "2",
        "--host=127.0.0.1",
    ]
    assert load_backend("ollama").launch_env(9) == {"OLLAMA_HOST": "127.0.0.1:9"}
    with pytest.raises(BackendUnreachable, match="backend.launch.command: missing"):
        engine_command(load_backend("openai"), LaunchConfig(), 9, "m")


def test_missing_binary(tmp_path):
    config = LaunchConfig(command="/nonexistent/llama-server --port {port}")
    with pytest.raises(BackendUnreachable, match="'/nonexistent/llama-server' cannot be run .*full path"):
        launch(load_backend("llamacpp"), config, None, "m", tmp_path / "engine.log")


def test_port_taken(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        config = LaunchConfig(command=f"{sys.executable} {GT_SERVER} --port {{port}}")
        with pytest.raises(BackendUnreachable, match=f"port {port} is already taken"):
            launch(Backend(), config, f"http://127.0.0.1:{port}", "m", tmp_path / "engine.log")


def test_engine_exits_during_start_shows_its_log(tmp_path):
    config = LaunchConfig(command=f"{sys.executable} -c \"print('CUDA out of memory'); raise SystemExit(3)\"")
    with pytest.raises(BackendUnreachable, match=r"exited with code 3 .*\n.*CUDA out of memory"):
        launch(Backend(), config, None, "m", tmp_path / "engine.log")


def _pgid_file_command(tmp_path: Path) -> tuple[str, Path]:
    """A shell that starts a child and never listens; it writes its process group id first."""
    pid_file = tmp_path / "pgid"
    script = f"echo $$ > {pid_file}; echo starting; sleep 60 & sleep 60"
    return f"sh -c '{script}'", pid_file


def _assert_group_gone(pid_file: Path) -> None:
    pgid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(pgid), "the engine's process group outlived the launch"


def test_readiness_timeout_kills_the_whole_group(tmp_path):
    command, pid_file = _pgid_file_command(tmp_path)
    config = LaunchConfig(command=command, ready_timeout_s=1.0)
    with pytest.raises(BackendUnreachable, match=r"ready_timeout_s: not ready after 1 s .*\n(.*\n)*starting"):
        launch(Backend(), config, None, "m", tmp_path / "engine.log")
    _assert_group_gone(pid_file)


class InterruptedWhileLoading(Backend):
    """Ctrl-C arriving while the engine loads its model (after_ready runs then)."""

    ready_paths = ("/health",)

    def after_ready(self, url, model, log):
        raise KeyboardInterrupt


def test_ctrl_c_during_start_stops_the_engine(tmp_path):
    config = LaunchConfig(
        command=f"sh -c 'echo $$ > {tmp_path}/pgid; exec {sys.executable} {GT_SERVER} --port {{port}}'",
        ready_timeout_s=30,
    )
    with pytest.raises(KeyboardInterrupt):
        launch(InterruptedWhileLoading(), config, None, "m", tmp_path / "engine.log")
    _assert_group_gone(tmp_path / "pgid")


def test_stop_after_a_run_ends_the_group(tmp_path):
    config = LaunchConfig(
        command=f"sh -c 'echo $$ > {tmp_path}/pgid; sleep 60 & exec {sys.executable} {GT_SERVER} --port {{port}}'",
        ready_timeout_s=30,
    )
    launched = launch(Backend(), config, None, "m", tmp_path / "engine.log")
    assert launched.pid == int((tmp_path / "pgid").read_text()) and launched.process.poll() is None
    launched.stop()
    _assert_group_gone(tmp_path / "pgid")
    assert os.path.getsize(tmp_path / "engine.log") > 0
