"""Meta stores hold positions, pipeline state and task state; SQLite embedded, ZooKeeper for HA."""

from __future__ import annotations

from typing import TYPE_CHECKING

from setl.meta.base import MetaStore, PipelineState, Status
from setl.meta.sqlite import SqliteMetaStore

if TYPE_CHECKING:
    from setl.config import NodeSettings

__all__ = ["MetaStore", "PipelineState", "Status", "SqliteMetaStore", "open_meta_store"]


def open_meta_store(settings: NodeSettings) -> MetaStore:
    """The meta store a node's settings ask for."""
    from setl.errors import ConfigError

    if settings.meta.store == "sqlite":
        return SqliteMetaStore(settings.resolve(settings.meta.path))
    if settings.meta.store == "zookeeper":
        from setl.meta.zookeeper import ZooKeeperMetaStore  # imports kazoo: only when asked for

        return ZooKeeperMetaStore.from_settings(settings)
    raise ConfigError(f"meta.store {settings.meta.store!r} is not available in this build")
