"""Starting an engine for a run and stopping it after; probing that an engine answers.

The engine runs in its own process group (so stopping it stops its children too), with
its output captured into the results folder. Nothing here knows an engine's internals:
an engine is a command line, a port and a readiness URL.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse


class BackendUnreachable(Exception):
    """The engine does not answer; the message names the URL and what to do."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(url: str, headers: dict | None = None, timeout_s: float = 5.0) -> str:
    """GET /health, else /v1/models. Returns the path that answered; raises BackendUnreachable."""
    problems = []
    for path in ("/health", "/v1/models"):
        req = urllib.request.Request(url.rstrip("/") + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                if resp.status < 400:
                    return path
                problems.append(f"{path}: HTTP {resp.status}")
        except urllib.error.HTTPError as e:
            problems.append(f"{path}: HTTP {e.code}")
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise BackendUnreachable(
                f"backend.url: cannot reach {url} ({reason}); start the engine there, "
                f"or set backend.launch so bench starts it") from None
    raise BackendUnreachable(f"backend.url: {url} answers but is not ready ({'; '.join(problems)})")


def default_command(kind: str, port: int, model: str) -> list[str]:
    """The launch command when backend.launch gives none."""
    if kind == "native":
        return [sys.executable, "-m", "native_engine", "serve", "--port", str(port)]
    if kind == "vllm":
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
                "--port", str(port), "--model", model]
    if kind == "llamacpp":
        return ["llama-server", "--host", "127.0.0.1", "--port", str(port), "-m", model]
    raise BackendUnreachable(f"backend.launch.command: missing; bench has no default command for kind {kind!r}")


@dataclass
class LaunchedBackend:
    url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL if it lingers."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=grace_s)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def launch(kind: str, launch_config, url: str | None, model: str, log_path: Path,
           headers: dict | None = None) -> LaunchedBackend:
    """Starts the engine and waits until it answers; `{port}`, `{host}` and `{model}` in the
    command and args are filled in. The caller must call stop()."""
    port = urlparse(url).port if url else None
    port = port or free_port()
    url = url or f"http://127.0.0.1:{port}"
    if launch_config.command:
        fill = {"port": port, "host": "127.0.0.1", "model": model}
        command = [part.format(**fill) for part in shlex.split(launch_config.command)]
        command += [str(a).format(**fill) for a in launch_config.args]
    else:
        command = default_command(kind, port, model) + [str(a) for a in launch_config.args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    log.write(f"$ {shlex.join(command)}\n".encode())
    log.flush()
    env = {**os.environ, **{k: str(v) for k, v in launch_config.env.items()}}
    try:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    except FileNotFoundError:
        raise BackendUnreachable(f"backend.launch.command: {command[0]!r} not found; install it or give "
                                 f"the full path") from None
    finally:
        log.close()
    backend = LaunchedBackend(url, process, log_path)
    deadline = time.monotonic() + launch_config.ready_timeout_s
    while True:
        if process.poll() is not None:
            raise BackendUnreachable(f"backend.launch: the engine exited with code {process.returncode} "
                                     f"before it was ready; its log ({log_path}) ends with:\n{backend.log_tail()}")
        try:
            probe(url, headers, timeout_s=2.0)
            return backend
        except BackendUnreachable as e:
            if time.monotonic() > deadline:
                backend.stop()
                raise BackendUnreachable(f"backend.launch.ready_timeout_s: not ready after "
                                         f"{launch_config.ready_timeout_s:g} s ({e}); log: {log_path}") from None
        time.sleep(0.25)
