"""Starting an engine for a run and stopping it after; probing that an engine answers.

The engine runs in its own process group (so stopping it stops its children too), with
its output captured into the results folder. What differs per engine (default command line,
environment, readiness paths, a model pull) comes from its backend (backends/); here an engine
is a command line, a port and readiness URLs.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
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


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def probe(url: str, headers: dict | None = None, timeout_s: float = 5.0,
          ready_paths: tuple[str, ...] = ("/health", "/v1/models")) -> str:
    """GET each readiness path in turn. Returns the path that answered; raises BackendUnreachable."""
    problems = []
    for path in ready_paths:
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


def engine_command(backend, launch_config, port: int, model: str) -> list[str]:
    """The argument list: launch.command (with {port}, {host}, {model} filled in) or the
    backend's default, then launch.args."""
    fill = {"port": port, "host": "127.0.0.1", "model": model}
    if launch_config.command:
        command = [part.format(**fill) for part in shlex.split(launch_config.command)]
    else:
        try:
            command = backend.launch_command(port, model)
        except ValueError as e:
            raise BackendUnreachable(str(e)) from None
    return command + [str(a).format(**fill) for a in launch_config.args]


@dataclass
class LaunchedBackend:
    url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL if it lingers; also reaps a group
        whose leader already exited but left children behind."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + grace_s
        while group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=grace_s)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def launch(backend, launch_config, url: str | None, model: str, log_path: Path,
           headers: dict | None = None) -> LaunchedBackend:
    """Starts the engine in its own process group, output into log_path, and waits until it
    answers. Every failure stops what was started and raises BackendUnreachable with the
    log's tail; so does Ctrl-C (KeyboardInterrupt is re-raised after the stop)."""
    if isinstance(backend, str):  # a kind name: launch("native", ...)
        from backends import load_backend
        backend = load_backend(backend)
    port = urlparse(url).port if url else None
    if port and port_in_use(port):
        raise BackendUnreachable(f"backend.url: port {port} is already taken by another process; stop it, "
                                 f"or leave backend.url out so bench picks a free port")
    port = port or free_port()
    url = url or f"http://127.0.0.1:{port}"
    command = engine_command(backend, launch_config, port, model)
    command += backend.launch_args(log_path.parent, command)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    log.write(f"$ {shlex.join(command)}\n".encode())
    log.flush()
    env = {**os.environ, **backend.launch_env(port), **{k: str(v) for k, v in launch_config.env.items()}}
    try:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
    except (FileNotFoundError, PermissionError) as e:
        log.close()
        raise BackendUnreachable(f"backend.launch.command: {command[0]!r} cannot be run ({e.strerror}); install "
                                 f"it, put it on PATH, or give its full path in backend.launch.command") from None
    launched = LaunchedBackend(url, process, log_path)
    try:
        _wait_ready(launched, backend, launch_config, headers)
        backend.after_ready(url, model, log)
    except BaseException as e:
        launched.stop()
        if isinstance(e, BackendUnreachable):
            raise
        if isinstance(e, Exception):
            raise BackendUnreachable(f"backend.launch: {e}; the engine's log ({log_path}) ends with:\n"
                                     f"{launched.log_tail()}") from None
        raise
    finally:
        log.close()
    return launched


def _wait_ready(launched: LaunchedBackend, backend, launch_config, headers) -> None:
    process, log_path = launched.process, launched.log_path
    deadline = time.monotonic() + launch_config.ready_timeout_s
    while True:
        if process.poll() is not None:
            raise BackendUnreachable(f"backend.launch: the engine exited with code {process.returncode} "
                                     f"before it was ready; its log ({log_path}) ends with:\n{launched.log_tail()}")
        try:
            probe(launched.url, headers, timeout_s=2.0, ready_paths=backend.ready_paths)
            return
        except BackendUnreachable as e:
            if time.monotonic() > deadline:
                raise BackendUnreachable(
                    f"backend.launch.ready_timeout_s: not ready after {launch_config.ready_timeout_s:g} s ({e}); "
                    f"raise it if the engine is just slow; its log ({log_path}) ends with:\n"
                    f"{launched.log_tail()}") from None
        time.sleep(0.25)
