"""setl: change data capture from MySQL/MariaDB binlogs through Select, Extract, Transform (Spark) and Load.

The public API is what `__all__` names; everything else may change.
"""

from setl.errors import (
    ConfigError,
    ExtractError,
    LeadershipLost,
    LoadError,
    MetaStoreError,
    PipelinePaused,
    PluginError,
    PositionPurged,
    SetlError,
    SourceError,
    TransformError,
    TransientLoadError,
)
from setl.model import Ack, Batch, DdlChange, Op, Position, RowChange, Transaction
from setl.scheduler import Listener, Outcome, Scheduler
from setl.stages import Extract, Load, Select, TableExtract, Transform

__version__ = "0.1.0"

__all__ = [
    "Ack", "Batch", "DdlChange", "Op", "Position", "RowChange", "Transaction",
    "Select", "Extract", "TableExtract", "Transform", "Load",
    "Scheduler", "Listener", "Outcome",
    "SetlError", "ConfigError", "SourceError", "PositionPurged", "ExtractError", "TransformError",
    "LoadError", "TransientLoadError", "PluginError", "MetaStoreError", "LeadershipLost", "PipelinePaused",
]
