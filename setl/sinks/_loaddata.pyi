from collections.abc import Callable, Iterable, Mapping
from typing import Any

def load_data_text(images: Iterable[Mapping[str, Any]], other: Callable[[Any], str | None]) -> bytes | None: ...
