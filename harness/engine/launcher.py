"""Starting an engine for a run and stopping it after; checking that an engine answers (ready).

The engine runs in its own process group (so stopping it stops its children too), with
its output captured into the results folder. What differs per engine (default command line,
environment, readiness paths, a model pull) comes from its backend (backends/); here an engine
is a command line, a port and readiness URLs.

An engine never outlives bench: a small guard process holds the read end of a pipe whose write
end only bench holds. When bench exits in any way (kill -9 included) the kernel closes it, and
the guard stops the engine's process group (SIGTERM, then SIGKILL after GUARD_GRACE_S).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from backends import load_backend
from backends.http import request
from harness.engine.startup import launch_startup
from harness.results.schema import Startup

GUARD_GRACE_S = 2.0
# The guard: waits for EOF on stdin (bench gone, or the engine stopped normally), then ends the group.
_GUARD = """
import os, signal, sys, time
pgid = int(sys.argv[1])
sys.stdin.buffer.read()
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
if alive():
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + float(sys.argv[2])
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive():
        os.killpg(pgid, signal.SIGKILL)
"""


class BackendUnreachable(Exception):
    """The engine does not answer; the message names the URL and what to do."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def check_ready(
    url: str,
    headers: dict | None = None,
    timeout_s: float = 5.0,
    ready_paths: tuple[str, ...] = ("/health", "/v1/models"),
) -> str:
    """GET each readiness path in turn. Returns the path that answered; raises BackendUnreachable."""
    problems = []
    for path in ready_paths:
        try:
            status, _ = request(url.rstrip("/") + path, headers=headers, timeout_s=timeout_s)
            if status < 400:
                return path
            problems.append(f"{path}: HTTP {status}")
        except OSError as e:
            reason = getattr(e, "reason", e)
            raise BackendUnreachable(
                f"backend.url: cannot reach {url} ({reason}); start the engine there, "
                f"or set backend.launch so bench starts it"
            ) from None
    raise BackendUnreachable(f"backend.url: {url} answers but is not ready ({'; '.join(problems)})")


@dataclass
class EngineSizing:
    """What the run asks of an engine bench starts with its default command (backends size their flags by it)."""

    threads: int  # CPU threads for the engine: the machine's cores
    slots: int  # requests the engine must hold at once (the run's concurrency, at least)
    tokens_per_slot: int  # the longest prompt plus answer of one request (a session's whole history)


def engine_command(backend, launch_config, port: int, model: str, sizing: EngineSizing | None = None) -> list[str]:
    """The argument list: launch.command (with {port}, {host}, {model} filled in), or the backend's
    default (its program replaced by launch.program, its sizing flags added unless launch.args has
    them), then launch.args."""
    fill = {"port": port, "host": "127.0.0.1", "model": model}
    args = [str(a).format(**fill) for a in launch_config.args]
    if launch_config.command:
        return [part.format(**fill) for part in shlex.split(launch_config.command)] + args
    try:
        command = backend.launch_command(port, model)
    except ValueError as e:
        raise BackendUnreachable(str(e)) from None
    if getattr(launch_config, "program", None):
        command = [launch_config.program, *command[1:]]
    given = {a.split("=", 1)[0] for a in args}
    for spellings, value in backend.sizing_args(sizing) if sizing else ():
        if not given & set(spellings):
            command += [spellings[0], value]
    return command + args


@dataclass
class LaunchedBackend:
    url: str
    process: subprocess.Popen
    log_path: Path
    guard: subprocess.Popen | None = None
    # run.json's start-up block (harness/engine/startup.py), None until the engine is ready; first_request is set
    # by the run that sends the engine's first request
    startup: Startup | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_message(self) -> str | None:
        """None while the engine runs; else what ended it, with its log's path."""
        code = self.process.poll()
        if code is None:
            return None
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
        return f"the engine exited with {how} (log: {self.log_path})"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL if it lingers; also reaps a group
        whose leader already exited but left children behind."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            self.process.wait()
            self._release_guard()
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
        self._release_guard()

    def _release_guard(self) -> None:
        if self.guard is not None:
            self.guard.stdin.close()  # EOF: the guard finds the group gone and exits
            self.guard.wait(timeout=GUARD_GRACE_S + 5)
            self.guard = None

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


def start_guard(pgid: int) -> subprocess.Popen:
    """The process that stops group `pgid` once bench is gone (see the module's docstring)."""
    return subprocess.Popen(
        [sys.executable, "-c", _GUARD, str(pgid), str(GUARD_GRACE_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def launch(
    backend,
    launch_config,
    url: str | None,
    model: str,
    log_path: Path,
    headers: dict | None = None,
    sizing: EngineSizing | None = None,
) -> LaunchedBackend:
    """Starts the engine in its own process group, output into log_path, and waits until it
    answers. Every failure stops what was started and raises BackendUnreachable with the
    log's tail; so does Ctrl-C (KeyboardInterrupt is re-raised after the stop)."""
    if isinstance(backend, str):  # a kind name: launch("native", ...)
        backend = load_backend(backend)
    port, url = _launch_port(url)
    command = engine_command(backend, launch_config, port, model, sizing)
    command += backend.launch_args(log_path.parent, command)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    log.write(f"$ {shlex.join(command)}\n".encode())
    log.flush()
    env = {**os.environ, **backend.launch_env(port), **{k: str(v) for k, v in launch_config.env.items()}}
    # Ctrl-C or SIGTERM between the engine's start and its guard's would leave an engine nothing stops: held
    # until both run, then raised below, where the stop is
    started_s = time.monotonic()  # launch-to-ready counts from here: the engine's own process start included
    with HeldSignals() as held:
        try:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        except (FileNotFoundError, PermissionError) as e:
            log.close()
            which = "program" if getattr(launch_config, "program", None) else "command"
            raise BackendUnreachable(
                f"backend.launch.{which}: {command[0]!r} cannot be run ({e.strerror}); "
                f"install it, put it on PATH, or give its full path in "
                f"backend.launch.{which}"
            ) from None
        launched = LaunchedBackend(url, process, log_path, start_guard(process.pid))
    try:
        held.raise_pending()
        _wait_ready(launched, backend, launch_config, headers)
        backend.after_ready(url, model, log)
        log.flush()
        launched.startup = launch_startup(time.monotonic() - started_s, backend, log_path)
    except BaseException as e:
        launched.stop()
        if isinstance(e, BackendUnreachable):
            raise
        if isinstance(e, Exception):
            raise BackendUnreachable(
                f"backend.launch: {e}; the engine's log ({log_path}) ends with:\n{launched.log_tail()}"
            ) from None
        raise
    finally:
        log.close()
    return launched


def _launch_port(url: str | None) -> tuple[int, str]:
    """backend.url's port, refused when another process holds it, else a free one on loopback; and the url."""
    port = urlparse(url).port if url else None
    if port and port_in_use(port):
        raise BackendUnreachable(
            f"backend.url: port {port} is already taken by another process; stop it, "
            f"or leave backend.url out so bench picks a free port"
        )
    port = port or free_port()
    return port, url or f"http://127.0.0.1:{port}"


class HeldSignals:
    """A block during which SIGINT and SIGTERM are noted instead of acted on (main thread only: elsewhere Python
    delivers no signal anyway); raise_pending() then acts on the first as its handler would have."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> HeldSignals:
        self.pending: list[int] = []
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {
                sig: signal.signal(sig, lambda signum, frame: self.pending.append(signum)) for sig in self.SIGNALS
            }
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def raise_pending(self) -> None:
        if self.pending:
            signum = self.pending[0]
            handler = self.previous[signum]
            if callable(handler):
                handler(signum, None)  # KeyboardInterrupt, or bench's Terminated
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def _wait_ready(launched: LaunchedBackend, backend, launch_config, headers) -> None:
    process, log_path = launched.process, launched.log_path
    deadline = time.monotonic() + launch_config.ready_timeout_s
    while True:
        if process.poll() is not None:
            raise BackendUnreachable(
                f"backend.launch: the engine exited with code {process.returncode} "
                f"before it was ready; its log ({log_path}) ends with:\n{launched.log_tail()}"
            )
        try:
            check_ready(launched.url, headers, timeout_s=2.0, ready_paths=backend.ready_paths)
            return
        except BackendUnreachable as e:
            if time.monotonic() > deadline:
                raise BackendUnreachable(
                    f"backend.launch.ready_timeout_s: not ready after {launch_config.ready_timeout_s:g} s ({e}); "
                    f"raise it if the engine is just slow; its log ({log_path}) ends with:\n"
                    f"{launched.log_tail()}"
                ) from None
        time.sleep(0.25)
