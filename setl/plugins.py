"""The transform plugin API: declare a transform and its parameters, discover and validate them.

A transform is a function ``(DataFrame, params, context) -> DataFrame`` registered
by name with `@transform`, or a `TransformPlugin` subclass. A `Registry` finds
them through the ``setl.transforms`` entry-point group (the built-ins come this
way too) and in the plugin directories of the config, and validates every
pipeline step against the declared parameters at startup, before leadership is
taken. Every error is a `PluginError` that names the plugin and the parameter.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import attrs

from setl.config import TransformStep
from setl.errors import PluginError
from setl.registry import TRANSFORMS, PluginGroup, blocked, clash

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = TRANSFORMS
#: A step key every transform accepts: the step may drop delete rows (see `SparkTransform`).
MAY_DROP_DELETES = "may_drop_deletes"

class _Missing:
    def __repr__(self) -> str:
        return "<required>"


_MISSING: Any = _Missing()


@attrs.frozen
class Param:
    """One declared parameter of a transform.

    `type` is a Python type or typing form: ``str``, ``int``, ``float``, ``bool``,
    ``list[str]``, ``dict[str, str]``, ``Literal["csv", "parquet"]``,
    ``str | None``, ``Any``. A parameter without a default is required unless
    `required=False` is given, in which case it defaults to None.
    """

    type: Any = Any
    required: bool | None = None
    default: Any = _MISSING
    help: str = ""
    name: str = ""

    @property
    def is_required(self) -> bool:
        if self.required is not None:
            return self.required
        return self.default is _MISSING

    @property
    def default_value(self) -> Any:
        return None if self.default is _MISSING else self.default

    def describe(self) -> str:
        text = f"{self.name}: {type_label(self.type)}"
        if self.is_required:
            return text + " (required)"
        return text + f" = {self.default_value!r}"


@attrs.frozen
class TransformContext:
    """What a transform knows about where it runs; built fresh for each table of each batch."""

    pipeline: str
    source_table: str | None
    target_table: str
    batch_id: int
    epoch: int
    params: Mapping[str, Any]
    spark: Any = attrs.field(repr=False, eq=False)
    step: str = ""
    may_drop_deletes: bool = False


TransformFn = Callable[[Any, Mapping[str, Any], TransformContext], Any]


@attrs.frozen
class Plugin:
    """A registered transform: its function, declared parameters and where it came from.

    `renames` maps validated params to the column renames the step performs, so
    the stage can follow renamed primary-key columns. `check` validates params
    beyond their types (raise ValueError). `may_drop_deletes` declares that the
    transform may legitimately remove delete rows.
    """

    name: str
    func: TransformFn = attrs.field(eq=False)
    params: tuple[Param, ...] = ()
    help: str = ""
    may_drop_deletes: bool = False
    renames: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = attrs.field(default=None, eq=False)
    check: Callable[[Mapping[str, Any]], None] | None = attrs.field(default=None, eq=False)
    origin: str = ""
    definition: str = ""
    open_params: bool = False


@attrs.frozen
class BoundStep:
    """A validated pipeline step: a plugin with its complete parameters (defaults filled in)."""

    plugin: Plugin
    params: Mapping[str, Any]
    may_drop_deletes: bool = False
    index: int = 0

    @property
    def name(self) -> str:
        return self.plugin.name

    def renames(self) -> Mapping[str, str]:
        """Column renames this step performs (old name -> new name)."""
        if self.plugin.renames is None:
            return {}
        return dict(self.plugin.renames(self.params))


# --- declaring ------------------------------------------------------------------------------


def _normalize_params(params: Mapping[str, Any] | None, plugin: str) -> tuple[Param, ...]:
    result = []
    for name, spec in (params or {}).items():
        if name == MAY_DROP_DELETES:
            raise PluginError(f"parameter name {MAY_DROP_DELETES!r} is reserved", plugin=plugin)
        if not isinstance(spec, Param):
            spec = Param(type=spec)  # a bare type: a required parameter of that type
        result.append(attrs.evolve(spec, name=name))
    return tuple(result)


def transform(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    help: str | None = None,
    may_drop_deletes: bool = False,
    renames: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None,
    check: Callable[[Mapping[str, Any]], None] | None = None,
) -> Callable[[TransformFn], TransformFn]:
    """Declare a function ``(df, params, context) -> df`` as the transform `name`.

    `params` maps parameter names to `Param`s (or to bare types, meaning
    required). The function is returned unchanged, so it stays callable; the
    declaration is attached as ``__setl_plugin__``.
    """

    def decorate(func: TransformFn) -> TransformFn:
        doc = help if help is not None else (inspect.getdoc(func) or "").split("\n")[0]
        func.__setl_plugin__ = Plugin(  # type: ignore[attr-defined]
            name=name,
            func=func,
            params=_normalize_params(params, name),
            help=doc,
            may_drop_deletes=may_drop_deletes,
            renames=renames,
            check=check,
            definition=_definition(func),
        )
        return func

    return decorate


class TransformPlugin:
    """Base class for a transform that needs state or helpers; an alternative to `@transform`.

    Set `name` and `params` (and optionally `may_drop_deletes`) as class
    attributes and implement `apply`. One instance is created per registry.
    Override `check` to validate params beyond their types, and `renames` if
    the transform renames columns.
    """

    name: str = ""
    params: Mapping[str, Any] = {}
    may_drop_deletes: bool = False

    def apply(self, df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
        raise NotImplementedError

    def check(self, params: Mapping[str, Any]) -> None:
        """Raise ValueError when params are inconsistent."""

    def renames(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {}

    @classmethod
    def to_plugin(cls) -> Plugin:
        if not cls.name:
            raise PluginError(f"{cls.__qualname__} does not set a transform name")
        instance = cls()
        return Plugin(
            name=cls.name,
            func=instance.apply,
            params=_normalize_params(cls.params, cls.name),
            help=(inspect.getdoc(cls) or "").split("\n")[0],
            may_drop_deletes=cls.may_drop_deletes,
            renames=instance.renames,
            check=instance.check,
            definition=_definition(cls),
        )


def _definition(obj: Any) -> str:
    """Where an object is defined (file and qualified name): one plugin found twice is not a clash."""
    try:
        where = str(Path(inspect.getfile(obj)).resolve())
    except (TypeError, OSError):
        where = getattr(obj, "__module__", "?")
    return f"{where}:{getattr(obj, '__qualname__', '?')}"


def as_plugin(obj: Any) -> Plugin | None:
    """The `Plugin` an object declares (decorated function or plugin class), or None."""
    if isinstance(obj, Plugin):
        return obj
    if inspect.isclass(obj) and issubclass(obj, TransformPlugin) and obj is not TransformPlugin:
        return obj.to_plugin()
    declared = getattr(obj, "__setl_plugin__", None)
    return declared if isinstance(declared, Plugin) else None


# --- parameter types ------------------------------------------------------------------------


def type_label(tp: Any) -> str:
    if tp is Any:
        return "any"
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_label(a) for a in args)
    if origin in (list, tuple, Sequence):
        return f"list of {type_label(args[0])}" if args else "list"
    if origin in (dict, Mapping):
        return f"mapping of {type_label(args[0])} to {type_label(args[1])}" if args else "mapping"
    return getattr(tp, "__name__", str(tp))


def check_type(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits a declared parameter type (ints count as floats, bools never as ints)."""
    if tp is Any:
        return True
    if tp is type(None) or tp is None:
        return value is None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return value in args
    if origin in (Union, types.UnionType):
        return any(check_type(value, a) for a in args)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        return not args or all(check_type(v, args[0]) for v in value)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            return False
        if not args:
            return True
        return all(check_type(k, args[0]) and check_type(v, args[1]) for k, v in value.items())
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


# --- the registry ---------------------------------------------------------------------------


# --- the entry-point loader: setl.registry ----------------------------------------------------


def _as_transform(obj: Any) -> Any:
    if as_plugin(obj) is None:
        raise TypeError("is not declared with @setl.plugins.transform or a TransformPlugin subclass")
    return obj


@attrs.frozen
class PluginInfo:
    """One line of `setl plugins list`."""

    name: str
    origin: str
    help: str
    params: tuple[str, ...]


class Registry:
    """Transforms by name, from entry points, plugin directories and direct registration.

    ``Registry().discover(dirs)`` loads the ``setl.transforms`` entry points
    (built-ins included, through `setl.registry.PluginGroup`, as sources and targets are) and
    imports every module and package in `dirs`. As for connectors, a name provided twice (two
    distributions, a directory and a distribution, two directories, with different
    definitions), a broken entry point and a name in `blocked` (``plugins.blocked`` in
    ``setl.yaml``) are each a `PluginError` that `get` raises and `broken` lists: pipelines that
    use other transforms still start. A plugin directory that does not exist or a module in it
    that fails to import is an error at once (the directory was configured, the names it would
    provide are unknown).
    """

    def __init__(self, blocked: Iterable[str] = ()) -> None:
        self.blocked = frozenset(blocked)
        self._plugins: dict[str, Plugin] = {}
        self._broken: dict[str, PluginError] = {}

    # registration

    def register(self, obj: Any, origin: str = "", *, name: str | None = None) -> Plugin:
        """Add a decorated function, `TransformPlugin` subclass or `Plugin`.

        A plain function without a declaration is accepted too when `name` is
        given; it then takes any parameters.
        """
        plugin = as_plugin(obj)
        if plugin is None:
            if callable(obj) and name:
                plugin = Plugin(name=name, func=obj, help=(inspect.getdoc(obj) or "").split("\n")[0],
                                definition=_definition(obj), open_params=True)
            else:
                raise PluginError(f"{obj!r} is not a transform (use @setl.plugins.transform)",
                                  plugin=name, origin=origin or None)
        if name and name != plugin.name:
            plugin = attrs.evolve(plugin, name=name)
        plugin = attrs.evolve(plugin, origin=origin or plugin.origin or plugin.definition)
        if plugin.name in self.blocked:
            raise blocked("transform", plugin.name)
        existing = self._plugins.get(plugin.name)
        if existing is not None:
            if existing.definition == plugin.definition:
                return existing
            raise clash("transform", plugin.name, existing.origin, plugin.origin)
        self._plugins[plugin.name] = plugin
        return plugin

    def _offer(self, obj: Any, origin: str, name: str | None = None) -> Plugin | None:
        """`register` for what discovery finds: a clash or a blocked name is remembered for `get`
        (and logged) instead of stopping the discovery of the other transforms."""
        try:
            return self.register(obj, origin, name=name)
        except PluginError as exc:
            key = str(exc.context.get("plugin") or name)
            if key in self._broken:  # already refused (a third definition): keep the first reason
                return None
            self._plugins.pop(key, None)
            self._broken[key] = exc
            log.warning("%s", exc)
            return None

    def discover(self, dirs: Iterable[str | Path] = (), *, entry_points: bool = True) -> "Registry":
        """Load entry points (unless disabled) and the plugin modules in `dirs`; return self."""
        if entry_points:
            self.load_entry_points()
        for folder in dirs:
            self.load_dir(folder)
        return self

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Register every transform of the entry-point `group`: setl's built-ins come this way too
        (setup.cfg), as its connectors do, so this module never imports them."""
        # A broken, twice-provided or blocked plugin must not stop pipelines that do not use it:
        # remember its error and raise it only when the plugin is asked for.
        plugins = PluginGroup(group, "transform", lambda name, obj: _as_transform(obj))
        for name in plugins.names():
            loaded = plugins.load(name, self.blocked)
            if isinstance(loaded, PluginError):
                self._broken[name] = loaded
                log.warning("%s", loaded)
            elif loaded is not None:
                self._offer(loaded[0], loaded[1], name=name)

    def load_dir(self, folder: str | Path) -> list[Plugin]:
        """Import every ``*.py`` module and package in `folder` and register its transforms."""
        folder = Path(folder)
        if not folder.is_dir():
            raise PluginError(f"plugin directory {str(folder)!r} does not exist", origin=str(folder))
        found = []
        for path in sorted(folder.iterdir()):
            if path.name.startswith((".", "_")):
                continue
            if path.is_file() and path.suffix == ".py":
                module = self._import(path, path, None)
            elif path.is_dir() and (path / "__init__.py").is_file():
                module = self._import(path, path / "__init__.py", [str(path)])
            else:
                continue
            for obj in _declared_in(module):
                plugin = self._offer(obj, f"file {path}")
                if plugin is not None:
                    found.append(plugin)
        return found

    def _import(self, path: Path, file: Path, search: list[str] | None) -> types.ModuleType:
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
        mod_name = f"setl_plugin_{path.stem}_{digest}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, file, submodule_search_locations=search)
        if spec is None or spec.loader is None:
            raise PluginError(f"cannot import plugin file {path}", origin=str(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(mod_name, None)
            raise PluginError(f"importing plugin {path} failed: {type(exc).__name__}: {exc}",
                              origin=str(path)) from exc
        return module

    # lookup and validation

    def get(self, name: str) -> Plugin:
        """The transform `name`; a PluginError if it is unknown, blocked, broken or provided twice."""
        if name in self._broken:
            raise self._broken[name]
        try:
            return self._plugins[name]
        except KeyError:
            known = ", ".join(sorted(self._plugins)) or "none"
            raise PluginError(f"unknown transform {name!r} (known: {known})", plugin=name) from None

    def __contains__(self, name: str) -> bool:
        return name in self._plugins

    def broken(self) -> dict[str, PluginError]:
        """The transforms `get` refuses (blocked, broken or provided twice) with their errors."""
        return dict(sorted(self._broken.items()))

    def list(self) -> list[PluginInfo]:
        return [
            PluginInfo(p.name, p.origin, p.help, tuple(q.describe() for q in p.params))
            for p in sorted(self._plugins.values(), key=lambda p: p.name)
        ]

    def validate(self, step: TransformStep, *, index: int = 0, **where: Any) -> BoundStep:
        """Check a step's params against its plugin; return it bound, with defaults filled in.

        `where` (pipeline=..., table=...) is added to the error context.
        """
        plugin = self.get(step.use) if not where else self._get_with_context(step.use, where)

        def fail(message: str, param: str | None = None) -> PluginError:
            return PluginError(message, plugin=plugin.name, param=param, **where)

        given = dict(step.params)
        may_drop = given.pop(MAY_DROP_DELETES, plugin.may_drop_deletes)
        if not isinstance(may_drop, bool):
            raise fail(f"expected true or false, got {may_drop!r}", MAY_DROP_DELETES)
        if plugin.open_params:
            return BoundStep(plugin, given, may_drop, index)
        declared = {p.name: p for p in plugin.params}
        for key in given:
            if key not in declared:
                known = ", ".join(declared) or "none"
                raise fail(f"unknown parameter {key!r} (known: {known})", key)
        params: dict[str, Any] = {}
        for name, spec in declared.items():
            if name not in given:
                if spec.is_required:
                    raise fail(f"required parameter {name!r} is missing ({spec.help or type_label(spec.type)})", name)
                params[name] = spec.default_value
                continue
            value = given[name]
            if not check_type(value, spec.type):
                raise fail(f"parameter {name!r}: expected {type_label(spec.type)}, got {value!r}", name)
            if spec.type is float and isinstance(value, int):
                value = float(value)
            params[name] = value
        if plugin.check is not None:
            try:
                plugin.check(params)
            except PluginError as exc:
                exc.with_context(plugin=plugin.name, **where)
                raise
            except (ValueError, TypeError, KeyError) as exc:
                param = getattr(exc, "param", None)
                raise fail(str(exc.args[0]) if exc.args else str(exc), param) from exc
        return BoundStep(plugin, params, may_drop, index)

    def _get_with_context(self, name: str, where: Mapping[str, Any]) -> Plugin:
        try:
            return self.get(name)
        except PluginError as exc:
            exc.with_context(**where)
            raise



class ParamError(ValueError):
    """Raised by a plugin's `check` to name the parameter at fault."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _declared_in(module: types.ModuleType) -> list[Any]:
    """The transforms a plugin module defines itself (not ones it merely imports)."""
    prefix = module.__name__
    result = []
    for obj in list(vars(module).values()):
        plugin_module = getattr(obj, "__module__", "") or ""
        if plugin_module != prefix and not plugin_module.startswith(prefix + "."):
            continue
        if as_plugin(obj) is not None and not isinstance(obj, Plugin):
            result.append(obj)
    return result


def load_registry(dirs: Iterable[str | Path] = (), *, base: str | Path | None = None,
                  blocked: Iterable[str] = ()) -> Registry:
    """A registry with every entry point and the plugin dirs (relative to `base`, the conf dir),
    the `blocked` names (``plugins.blocked``) refused."""
    resolved = [Path(base) / d if base is not None and not Path(d).is_absolute() else Path(d) for d in dirs]
    return Registry(blocked).discover(resolved)


def format_plugin_table(dirs: Iterable[str | Path] = (), registry: Registry | None = None,
                        blocked: Iterable[str] = ()) -> str:
    """The text of ``setl plugins list``: name, origin and parameters of every transform, and a
    refused one (blocked, broken, provided twice) with its error.

    Discovers entry points and the plugin `dirs` (`blocked` refused) unless a `registry` is given.
    """
    registry = registry if registry is not None else Registry(blocked).discover(dirs)
    infos = registry.list()
    refused = registry.broken()
    if not infos and not refused:
        return "no transforms found"
    width = max(len("NAME"), *(len(i.name) for i in infos), *(len(n) for n in refused))
    lines = [f"{'NAME':<{width}}  ORIGIN"]
    for name, error in refused.items():
        state = "BLOCKED" if name in registry.blocked else "BROKEN"
        lines.append(f"{name:<{width}}  {state}: {error}")
    for info in infos:
        lines.append(f"{info.name:<{width}}  {info.origin}")
        if info.help:
            lines.append(f"{'':<{width}}    {info.help}")
        for param in info.params:
            lines.append(f"{'':<{width}}    - {param}")
    return "\n".join(lines)
