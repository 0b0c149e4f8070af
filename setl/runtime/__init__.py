"""Thread machinery shared by the pipeline stages: a slot-ordered executor and a dynamic task runner."""

from setl.runtime.batch_cap import BatchCap
from setl.runtime.serial_executor import (
    BatchLatch,
    RejectedTask,
    SerialExecutorService,
    SerialTask,
    hash_slot,
)
from setl.runtime.task_execution import (
    ExecutionStats,
    Progress,
    Task,
    TaskExecutionService,
    TaskHandle,
)

__all__ = [
    "BatchCap",
    "BatchLatch",
    "ExecutionStats",
    "Progress",
    "RejectedTask",
    "SerialExecutorService",
    "SerialTask",
    "Task",
    "TaskExecutionService",
    "TaskHandle",
    "hash_slot",
]
