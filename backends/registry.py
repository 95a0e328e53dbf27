"""A registry of named classes: a name looked up among "module:Class" entries and its class imported.

Backends (`backend.kind`), arrival processes (`load.arrival`) and workload kinds (`workload.kind`) are each such
a registry: the built-ins as a dict, and for the first two the installed packages' entry points too. It lives in
backends/, the package below harness, so both may import it (docs/extending.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points


def registered(builtin: Mapping[str, str], group: str | None = None) -> dict[str, str]:
    """{name: "module:Class"}: the built-ins, then every entry point of `group` (a package's entry replaces a
    built-in of the same name)."""
    found = dict(builtin)
    if group is not None:
        found.update({ep.name: ep.value for ep in entry_points(group=group)})
    return found


def registered_class(name: str, known: Mapping[str, str], unknown: Callable[[], Exception]) -> type:
    """The class `known[name]` names, imported; the exception `unknown()` builds when `name` is not in `known` (each
    registry's own, naming its YAML field and the known names)."""
    if name not in known:
        raise unknown()
    module_name, _, class_name = known[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
