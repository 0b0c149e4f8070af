"""setl: change data capture from MySQL/MariaDB binlogs through Select, Extract, Transform (Spark) and Load.

The public API is what `__all__` names, and the modules `PUBLIC_MODULES` names (documented in
docs/python-api.md); everything else may change.
"""

from setl import _compiled  # noqa: F401 - first: chooses compiled modules or their sources
from setl.connectors import BuildContext, SourceConnector, TargetConnector
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
from setl.stages import (
    Extract,
    Load,
    LoadCapabilities,
    LoadWrapper,
    Select,
    SelectCapabilities,
    SelectWrapper,
    TableExtract,
    Transform,
)

__version__ = "0.1.0"

#: Modules whose documented names are public as a whole (plugin and connector authors use them).
PUBLIC_MODULES = (
    "setl.plugins",             # transform plugins: @transform, Param, ParamError, TransformPlugin, TransformContext
    "setl.connectors",          # source and target plugins: SourceConnector, TargetConnector, BuildContext
    "setl.testing.harness",     # pipelines without a binlog or a target: ScriptedSource, MemorySink, FaultPlan
    "setl.testing.spark",       # run a transform on a local Spark: run_transform, make_batch, local_spark
    "setl.testing.connectors",  # the connector test kit: LoadContract, SelectContract and their probes
)

__all__ = [
    "Ack", "Batch", "DdlChange", "Op", "Position", "RowChange", "Transaction",
    "Select", "SelectWrapper", "SelectCapabilities", "Extract", "TableExtract", "Transform",
    "Load", "LoadWrapper", "LoadCapabilities",
    "SourceConnector", "TargetConnector", "BuildContext",
    "Scheduler", "Listener", "Outcome",
    "SetlError", "ConfigError", "SourceError", "PositionPurged", "ExtractError", "TransformError",
    "LoadError", "TransientLoadError", "PluginError", "MetaStoreError", "LeadershipLost", "PipelinePaused",
    "PUBLIC_MODULES",
]
