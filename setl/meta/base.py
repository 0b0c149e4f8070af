"""The meta store interface: acknowledged positions, pipeline state and ack history."""

from __future__ import annotations

import abc
import enum

import attrs

from setl.model import Ack, Position


class Status(str, enum.Enum):
    STOPPED = "stopped"
    RUNNING = "running"
    PAUSED = "paused"


@attrs.frozen
class PipelineState:
    """What a pipeline is doing. `error` says why it paused, when it paused on an error.

    `epoch` only grows: every start and every rollback takes a new one, so a
    target can refuse the writes of an older run.
    """

    pipeline: str
    status: Status = Status.STOPPED
    error: str | None = None
    epoch: int = 0
    node: str | None = None
    updated: float = 0.0


class MetaStore(abc.ABC):
    """Durable pipeline bookkeeping shared by the nodes and the CLI.

    Every write is atomic: an ack writes the position and its history row
    together or not at all. Implementations are safe to use from many threads,
    and from several processes at once (the CLI beside a running node).
    """

    @abc.abstractmethod
    def position(self, pipeline: str) -> Ack | None:
        """The last acknowledged (or reset) position, or None if the pipeline never ran."""

    @abc.abstractmethod
    def ack(self, pipeline: str, batch_id: int, epoch: int, position: Position, rows: int = 0) -> Ack:
        """Persist that everything before `position` is applied in the target."""

    @abc.abstractmethod
    def reset_position(self, pipeline: str, position: Position | None) -> None:
        """Set (or, with None, forget) the position an operator wants to restart from."""

    @abc.abstractmethod
    def position_was_reset(self, pipeline: str) -> bool:
        """True if the current position was set by an operator and not acked since."""

    @abc.abstractmethod
    def history(self, pipeline: str, limit: int = 20) -> list[Ack]:
        """The latest acks, newest first."""

    @abc.abstractmethod
    def state(self, pipeline: str) -> PipelineState:
        """The pipeline's state; STOPPED with epoch 0 if it never ran."""

    @abc.abstractmethod
    def set_state(
        self, pipeline: str, status: Status, error: str | None = None, node: str | None = None
    ) -> PipelineState:
        """Persist a status (and its error, or none) without touching the epoch."""

    @abc.abstractmethod
    def next_epoch(self, pipeline: str) -> int:
        """Take and persist a new epoch, higher than any taken before."""

    @abc.abstractmethod
    def pipelines(self) -> list[str]:
        """Every pipeline the store knows about."""

    def close(self) -> None:
        """Release connections. Idempotent."""
