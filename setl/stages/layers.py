"""Walking a stage's chain of wrappers: a `SelectWrapper` or `LoadWrapper` (or any stage with an
``inner``) wraps the stage below it, and these helpers find a layer without knowing the chain."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

L = TypeVar("L")


def unwrap(stage: Any) -> Iterator[Any]:
    """`stage` and every stage it wraps (through `inner`), outermost first."""
    seen: set[int] = set()
    while stage is not None and id(stage) not in seen:
        seen.add(id(stage))
        yield stage
        stage = getattr(stage, "inner", None)


def find_layer(stage: Any, kind: type[L]) -> L | None:
    """The outermost layer of `stage`'s chain that is a `kind`, or None."""
    return next((layer for layer in unwrap(stage) if isinstance(layer, kind)), None)


def layers(stage: Any) -> str:
    """`stage` and the stages it wraps (through `inner`), outermost first."""
    return " > ".join(type(layer).__name__ for layer in unwrap(stage))


__all__ = ["find_layer", "layers", "unwrap"]
