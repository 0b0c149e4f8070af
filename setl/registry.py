"""The one plugin registry: how every entry-point group of setl is read, loaded and reported.

setl has three extension points, each an entry-point group: ``setl.transforms`` (`setl.plugins`),
``setl.sources`` and ``setl.targets`` (`setl.connectors`). The built-ins register through the
same groups in setl's own ``setup.cfg``, as pluggy's eggsample does. A `PluginGroup` holds one
group's entry points by name and loads one the first time it is asked for, so every group
reports the same three failures the same way, as a `PluginError` naming the plugin, raised when
a pipeline uses it or shown as BROKEN by ``setl plugins list``, never stopping pipelines that
use other plugins:

- a *clash*: two distributions register the same name (``... is provided twice: by A and by B``);
- a *broken* plugin: its entry point fails to import, or what it names is not a valid
  declaration of the group (``cannot load entry point ...`` / ``entry point ... is not ...``);
- a *blocked* plugin: its name is listed under ``plugins.blocked`` in ``setl.yaml``. A blocked
  plugin is never imported, so a broken or unwanted distribution can be switched off without
  uninstalling it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

import attrs

from setl.errors import PluginError

TRANSFORMS = "setl.transforms"
SOURCES = "setl.sources"
TARGETS = "setl.targets"


@attrs.frozen
class EntryPoint:
    """One entry point of a setl group, not loaded yet: `name`, the ``module:attr`` `value`, and
    `origin`, the distribution that declares it (for error messages and `setl plugins list`)."""

    group: str
    name: str
    value: str
    dist: str
    _ep: metadata.EntryPoint = attrs.field(repr=False, eq=False)

    @property
    def origin(self) -> str:
        return f"{self.dist} (entry point {self.value})"

    def load(self, validate: Callable[[Any], Any]) -> Any:
        """Import the entry point and pass the object through `validate`; a `PluginError` naming
        the plugin and the entry point instead if either fails. `validate` returns what to
        register or raises ValueError or TypeError saying what is wrong ("is not ...")."""
        try:
            obj = self._ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure of a plugin is reported as its error
            return self._cannot_load(exc)
        try:
            return validate(obj)
        except PluginError as exc:
            return exc.with_context(plugin=self.name)
        except (TypeError, ValueError) as exc:
            error = PluginError(f"entry point {self.value!r} ({self.group}) from {self.dist} {exc}",
                                plugin=self.name)
            error.__cause__ = exc
            return error
        except Exception as exc:  # noqa: BLE001 - a factory the entry point names failed (an import inside it)
            return self._cannot_load(exc)

    def _cannot_load(self, exc: Exception) -> PluginError:
        error = PluginError(f"cannot load entry point {self.value!r} ({self.group}) from {self.dist}: "
                            f"{type(exc).__name__}: {exc}", plugin=self.name)
        error.__cause__ = exc
        return error


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of `group` (``setl.transforms``, ``setl.sources``, ``setl.targets``), once
    each, without importing them: the one loader every plugin group goes through, as pluggy's
    ``load_setuptools_entrypoints``. Loading (`EntryPoint.load`) is left to the caller, so a broken
    plugin is only reported when it is used or listed."""
    seen: set[tuple[str, str]] = set()
    found = []
    for ep in metadata.entry_points(group=group):
        if (ep.name, ep.value) in seen:  # one distribution visible twice on sys.path
            continue
        seen.add((ep.name, ep.value))
        dist = getattr(ep, "dist", None)
        label = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
        found.append(EntryPoint(group, ep.name, ep.value, label, ep))
    return found


def clash(what: str, name: str, first: str, second: str) -> PluginError:
    """The error for two plugins registering one name, in every group."""
    return PluginError(f"{what} {name!r} is provided twice: by {first} and by {second}; uninstall or rename "
                       "one of them", plugin=name)


def blocked(what: str, name: str) -> PluginError:
    """The error for a plugin named in ``plugins.blocked`` of ``setl.yaml``, in every group."""
    return PluginError(f"{what} {name!r} is blocked in setl.yaml (plugins.blocked); remove it from that list "
                       "to use it", plugin=name)


class PluginGroup:
    """The entry points of one group by name, each loaded and validated on first use.

    `what` names a plugin of the group in messages ("transform", "source type", "target type");
    `validate(name, obj)` turns what an entry point names into the registered object or raises
    TypeError or ValueError. `load` returns the object or the `PluginError` to raise, and remembers
    either, so a plugin is imported at most once per group. Thread-safe.
    """

    def __init__(self, group: str, what: str, validate: Callable[[str, Any], Any]) -> None:
        self.group = group
        self.what = what
        self._validate = validate
        self._lock = threading.Lock()
        self._entries: dict[str, list[EntryPoint]] | None = None
        self._loaded: dict[str, tuple[Any, str] | PluginError] = {}

    def entries(self) -> dict[str, list[EntryPoint]]:
        """The group's entry points by name (read once)."""
        with self._lock:
            if self._entries is None:
                by_name: dict[str, list[EntryPoint]] = {}
                for entry in entry_points(self.group):
                    by_name.setdefault(entry.name, []).append(entry)
                self._entries = by_name
            return self._entries

    def names(self) -> list[str]:
        """Every name an entry point of the group registers, sorted."""
        return sorted(self.entries())

    def load(self, name: str, block: Iterable[str] = ()) -> tuple[Any, str] | PluginError | None:
        """``(object, origin)``: what the entry point `name` registers, validated, and the
        distribution it comes from; None when no entry point has that name; the `PluginError` to
        raise when it is blocked (`block`: then it is never imported), provided twice, or broken."""
        if name in set(block):
            return blocked(self.what, name)
        found = self.entries().get(name)
        if not found:
            return None
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = self._load(name, found)
            return self._loaded[name]

    def _load(self, name: str, found: list[EntryPoint]) -> tuple[Any, str] | PluginError:
        if len(found) > 1:
            return clash(self.what, name, found[0].origin, found[1].origin)
        entry = found[0]
        loaded = entry.load(lambda obj: self._validate(name, obj))
        if isinstance(loaded, PluginError):
            return loaded
        return loaded, entry.origin


__all__ = ["SOURCES", "TARGETS", "TRANSFORMS", "EntryPoint", "PluginGroup", "blocked", "clash", "entry_points"]
