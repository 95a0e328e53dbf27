"""Engine backends, found by name in the `bench.backends` entry-point group.

A third-party package adds one by subclassing `backends.base.Backend` and declaring it:
    [project.entry-points."bench.backends"]
    myengine = "my_package.backend:MyEngineBackend"
The built-ins are declared the same way in this project's pyproject.toml; BUILTIN repeats
them so a source checkout that was never pip-installed still finds them.
"""

from __future__ import annotations

from backends.registry import registered, registered_class

GROUP = "bench.backends"
BUILTIN = {
    "openai": "backends.base:Backend",
    "native": "backends.native:NativeBackend",
    "vllm": "backends.vllm:VllmBackend",
    "sglang": "backends.sglang:SglangBackend",
    "trtllm": "backends.trtllm:TrtllmBackend",
    "llamacpp": "backends.llamacpp:LlamaServerBackend",
    "llamacpp_python": "backends.llamacpp:LlamaCppPythonBackend",
    "ollama": "backends.ollama:OllamaBackend",
}


def available() -> dict[str, str]:
    """{kind: "module:Class"} for every installed backend."""
    return registered(BUILTIN, GROUP)


def load_backend(kind: str, eos_token_ids: tuple[int, ...] = (), profile: bool = False, step_trace: bool = False):
    """An instance of the backend named `kind`; ValueError naming backend.kind if none is."""
    known = available()
    cls = registered_class(
        kind,
        known,
        lambda: ValueError(
            f"backend.kind: {kind!r} is not an installed backend; installed: {', '.join(sorted(known))} "
            f"(a package adds one through the {GROUP!r} entry-point group)"
        ),
    )
    return cls(eos_token_ids=tuple(eos_token_ids), profile=profile, step_trace=step_trace)
