"""Tests for SerialExecutorService, hash_slot and BatchLatch."""

from __future__ import annotations

import collections
import itertools
import logging
import os
import random
import subprocess
import sys
import threading
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import live_threads, wait_until

from setl.errors import SetlError
from setl.runtime import BatchLatch, RejectedTask, SerialExecutorService, hash_slot

_names = itertools.count()


@pytest.fixture
def make_executor():
    """Build executors with unique thread names; shut them down and check their threads are gone."""
    made = []

    def make(num_slots: int, max_workers: int | None = None) -> SerialExecutorService:
        ex = SerialExecutorService(num_slots, max_workers, name=f"sx{next(_names)}")
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown_now()
        assert ex.await_termination(10)
        assert live_threads(ex.name + "-") == []


class Recorder:
    """Runs as the body of many tasks; records order, per-slot overlap and thread use."""

    def __init__(self, ex: SerialExecutorService, seed: int) -> None:
        self.ex = ex
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.executed: dict[int | None, list[object]] = collections.defaultdict(list)
        self.active: collections.Counter = collections.Counter()
        self.max_active_per_slot = 0
        self.running = 0
        self.max_running = 0
        self.max_threads = 0
        self.thread_ids: set[int] = set()
        self.callbacks: list[tuple[object, BaseException | None]] = []

    def task(self, slot: int | None, token: object, delay: float, fail: bool) -> object:
        with self.lock:
            self.active[slot] += 1
            if slot is not None:
                self.max_active_per_slot = max(self.max_active_per_slot, self.active[slot])
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.thread_ids.add(threading.get_ident())
            self.max_threads = max(self.max_threads, len(live_threads(self.ex.name + "-")))
            self.executed[slot].append(token)
        try:
            if delay:
                threading.Event().wait(delay)  # a real pause inside the task, not a test sleep
            if fail:
                raise RuntimeError(f"task {token} fails on purpose")
            return token
        finally:
            with self.lock:
                self.active[slot] -= 1
                self.running -= 1

    def callback(self, handle) -> None:
        with self.lock:
            self.callbacks.append((handle.args[1], handle.exception()))


def run_stress(ex, submitters: int, per_submitter: int, seed: int, free_ratio: float = 0.2):
    """Submit from many threads at once; return the recorder and {token: handle}."""
    rec = Recorder(ex, seed)
    handles: dict[object, object] = {}
    handles_lock = threading.Lock()
    start = threading.Barrier(submitters)

    def submit_all(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        start.wait()
        for k in range(per_submitter):
            slot = None if rng.random() < free_ratio else rng.randrange(ex.num_slots)
            delay = rng.choice([0, 0, 0, 0.0005, 0.001])
            fail = rng.random() < 0.15
            token = (i, k)
            handle = ex.submit(rec.task, slot, token, delay, fail, slot=slot, callback=rec.callback)
            with handles_lock:
                handles[token] = handle

    threads = [threading.Thread(target=submit_all, args=(i,), name=f"submitter-{i}") for i in range(submitters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rec, handles


def check_stress(ex, rec: Recorder, handles: dict) -> None:
    """Per slot, execution order is the order submit() accepted the tasks, with no overlap."""
    wait_until(lambda: all(h.done() for h in handles.values()))
    wait_until(lambda: len(rec.callbacks) == len(handles))
    by_slot: dict[int | None, list[int]] = collections.defaultdict(list)
    for handle in handles.values():
        by_slot[handle.slot].append(handle.seq)
    for slot, tokens in rec.executed.items():
        if slot is None:
            continue
        executed_seqs = [handles[token].seq for token in tokens]
        assert executed_seqs == sorted(by_slot[slot]), f"slot {slot} ran out of submission order"
        # and so each submitter's own tasks on the slot ran in its order
        for submitter in {token[0] for token in tokens}:
            ks = [token[1] for token in tokens if token[0] == submitter]
            assert ks == sorted(ks)
    assert sum(len(v) for v in rec.executed.values()) == len(handles)
    assert rec.max_active_per_slot <= 1
    assert rec.max_running <= ex.max_workers
    assert len(rec.thread_ids) <= ex.max_workers
    assert rec.max_threads <= ex.max_workers
    assert ex.worker_count <= ex.max_workers
    for token, error in rec.callbacks:
        assert (error is None) == (handles[token].exception() is None)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    num_slots=st.integers(1, 8),
    max_workers=st.integers(1, 6),
    submitters=st.integers(1, 8),
    per_submitter=st.integers(1, 40),
    seed=st.integers(0, 2**31),
)
def test_slot_order_is_submission_order_property(make_executor, num_slots, max_workers, submitters, per_submitter,
                                                 seed):
    """Any pool shape, concurrent submitters: each slot runs in submission order, one at a time, within max_workers."""
    ex = make_executor(num_slots, max_workers)
    rec, handles = run_stress(ex, submitters, per_submitter, seed)
    check_stress(ex, rec, handles)


def test_slot_order_under_heavy_concurrent_submission(make_executor):
    """Many submitters, many slots, random delays and failures: per-slot order and exclusivity hold."""
    ex = make_executor(16, 4)
    rec, handles = run_stress(ex, submitters=10, per_submitter=150, seed=7)
    check_stress(ex, rec, handles)
    assert rec.max_running > 1, "the pool never ran tasks in parallel"


def test_different_slots_run_in_parallel(make_executor):
    """Tasks of different slots run at the same time on different workers."""
    ex = make_executor(3, 3)
    barrier = threading.Barrier(3, timeout=10)
    handles = [ex.submit(barrier.wait, slot=slot) for slot in range(3)]
    for handle in handles:
        handle.result(timeout=10)


def test_free_tasks_run_in_parallel_up_to_max_workers(make_executor):
    """Tasks without a slot run concurrently, but never on more than max_workers threads."""
    ex = make_executor(1, 2)
    release = threading.Event()
    started = []
    handles = [ex.submit(lambda i=i: (started.append(i), release.wait(10))) for i in range(3)]
    wait_until(lambda: len(started) == 2)
    assert ex.worker_count == 2
    assert len(live_threads(ex.name + "-")) == 2
    assert sum(h.running() for h in handles) == 2
    release.set()
    for handle in handles:
        handle.result(timeout=10)
    assert sorted(started) == [0, 1, 2]


def test_exception_reaches_callback_and_slot_continues(make_executor):
    """A task that raises reports to its future and callback; later tasks of its slot still run."""
    ex = make_executor(2, 2)
    ran, seen = [], []

    def boom():
        raise ValueError("bad row")

    handles = [
        ex.submit(ran.append, "a", slot=0, callback=seen.append),
        ex.submit(boom, slot=0, callback=seen.append),
        ex.submit(ran.append, "c", slot=0, callback=seen.append),
    ]
    wait_until(lambda: len(seen) == 3)
    assert ran == ["a", "c"]
    assert seen == handles
    assert isinstance(handles[1].exception(), ValueError)
    assert handles[2].exception() is None


def test_callback_exception_is_logged_and_worker_survives(make_executor, caplog):
    """A callback that raises is logged with its traceback and does not stop the slot or the worker."""
    ex = make_executor(1, 1)

    def bad_callback(handle):
        raise RuntimeError("callback broke")

    with caplog.at_level(logging.ERROR, logger="setl.runtime.serial_executor"):
        first = ex.submit(int, "1", slot=0, callback=bad_callback)
        second = ex.submit(int, "2", slot=0)
        assert second.result(timeout=10) == 2
    assert first.result() == 1
    records = [r for r in caplog.records if "callback" in r.getMessage()]
    assert records and records[0].exc_info is not None
    assert ex.worker_count == 1


def test_cancelled_task_is_skipped(make_executor):
    """A queued task cancelled through its handle never runs and its slot moves on."""
    ex = make_executor(1, 1)
    release, ran, callbacks = threading.Event(), [], []
    blocker = ex.submit(release.wait, 10, slot=0)
    victim = ex.submit(ran.append, "victim", slot=0, callback=callbacks.append)
    after = ex.submit(ran.append, "after", slot=0)
    assert victim.cancel()
    release.set()
    after.result(timeout=10)
    assert blocker.result() is True
    assert ran == ["after"]
    assert callbacks == []


def test_submit_rejects_bad_slot_and_bad_sizes():
    """A slot outside range(num_slots) and non-positive sizes are refused with ValueError."""
    with pytest.raises(ValueError):
        SerialExecutorService(0)
    with pytest.raises(ValueError):
        SerialExecutorService(2, 0)
    ex = SerialExecutorService(2, 1)
    try:
        for bad in (-1, 2):
            with pytest.raises(ValueError):
                ex.submit(print, slot=bad)
    finally:
        assert ex.shutdown(timeout=10)


def test_shutdown_runs_queued_tasks_and_refuses_new_ones(make_executor):
    """shutdown(): new submits raise RejectedTask, queued tasks still run, workers are joined."""
    ex = make_executor(2, 2)
    release, ran = threading.Event(), []
    ex.submit(release.wait, 10, slot=0)
    for i in range(5):
        ex.submit(ran.append, i, slot=i % 2)
    assert ex.shutdown(wait=False) is False
    assert ex.is_shutdown()
    with pytest.raises(RejectedTask) as info:
        ex.submit(print)
    assert isinstance(info.value, SetlError) and isinstance(info.value, RuntimeError)
    release.set()
    assert ex.shutdown(wait=True, timeout=10)
    assert sorted(ran) == [0, 1, 2, 3, 4]
    assert ex.is_terminated()
    assert live_threads(ex.name + "-") == []


def test_shutdown_now_returns_unrun_tasks_in_submission_order(make_executor):
    """shutdown_now() cancels and returns every queued task in order; the running one finishes."""
    ex = make_executor(3, 1)
    started, release, ran = threading.Event(), threading.Event(), []

    def blocker():
        started.set()
        release.wait(10)
        return "finished"

    running = ex.submit(blocker, slot=0)
    started.wait(10)
    queued = [ex.submit(ran.append, i, slot=(None if i % 4 == 3 else i % 3)) for i in range(9)]
    dropped = ex.shutdown_now()
    assert dropped == queued
    assert all(task.cancelled() for task in dropped)
    assert ex.await_termination(0.05) is False  # the blocker is still running
    release.set()
    assert ex.await_termination(10)
    assert running.result() == "finished"
    assert ran == []
    with pytest.raises(RejectedTask):
        ex.submit(print, slot=0)


def test_shutdown_now_leaves_out_tasks_cancelled_earlier(make_executor):
    """Tasks the caller cancelled before shutdown_now are not reported as unrun work."""
    ex = make_executor(1, 1)
    release = threading.Event()
    running = ex.submit(release.wait, 10, slot=0)
    wait_until(running.running)
    a = ex.submit(print, slot=0)
    b = ex.submit(print, slot=0)
    a.cancel()
    assert ex.shutdown_now() == [b]
    release.set()


def test_await_termination_before_shutdown_times_out(make_executor):
    """await_termination returns False while the executor is still open."""
    ex = make_executor(1, 1)
    ex.submit(print, slot=0).result(timeout=10)
    assert ex.await_termination(0.01) is False
    assert ex.shutdown(timeout=10)


def test_task_may_shut_down_its_own_executor_without_waiting(make_executor):
    """A task may call shutdown(wait=False) on its executor; waiting for itself raises instead of hanging."""
    ex = make_executor(1, 1)
    waiting = ex.submit(lambda: ex.shutdown(wait=True, timeout=10))
    with pytest.raises(RuntimeError):
        waiting.result(timeout=10)
    assert not ex.is_shutdown()
    handle = ex.submit(lambda: ex.shutdown(wait=False))
    assert handle.result(timeout=10) is False
    assert ex.await_termination(10)


def test_slot_for_is_round_robin_and_stable(make_executor):
    """New keys get slots round-robin; a key keeps its slot; concurrent callers agree."""
    ex = make_executor(3, 1)
    assert [ex.slot_for(k) for k in ["a", "b", "c", "d"]] == [0, 1, 2, 0]
    assert ex.slot_for("b") == 1
    ex2 = make_executor(64, 1)
    results: dict[str, set[int]] = collections.defaultdict(set)
    lock = threading.Lock()

    def grab(i: int) -> None:
        for k in range(64):
            slot = ex2.slot_for(f"k{(k + i) % 64}")
            with lock:
                results[f"k{(k + i) % 64}"].add(slot)

    threads = [threading.Thread(target=grab, args=(i,), name=f"grab-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(slots) == 1 for slots in results.values())
    assert sorted(s for slots in results.values() for s in slots) == list(range(64))


@given(key=st.one_of(st.text(), st.binary(), st.integers()), num_slots=st.integers(1, 1000))
def test_hash_slot_is_in_range_and_deterministic(key, num_slots):
    """hash_slot maps any key into range(num_slots), the same way every time."""
    slot = hash_slot(key, num_slots)
    assert 0 <= slot < num_slots
    assert hash_slot(key, num_slots) == slot


def test_hash_slot_is_stable_across_processes():
    """hash_slot does not depend on Python's per-process hash seed."""
    keys = ["shop.orders", "shop.items", "crm.users", 42, b"raw"]
    expected = [hash_slot(k, 16) for k in keys]
    assert expected[0] == zlib.crc32(b"shop.orders") % 16
    code = f"from setl.runtime import hash_slot; print([hash_slot(k, 16) for k in {keys!r}])"
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True,
            check=True,
        )
        assert out.stdout.strip() == repr(expected)
    with pytest.raises(ValueError):
        hash_slot("x", 0)


def test_batch_latch_opens_when_every_channel_counts_down():
    """The latch opens only after each channel has counted down; repeats count once."""
    latch = BatchLatch(["a", "b"])
    latch.count_down("a")
    latch.count_down("a")
    assert latch.remaining == {"b"}
    assert latch.wait(0.01) is False
    latch.count_down("b")
    assert latch.wait(0) is True
    assert latch.error is None and latch.failed_channel is None


def test_batch_latch_failure_opens_early_and_keeps_first_error():
    """A failing channel opens the latch at once; the first failure is the one recorded."""
    latch = BatchLatch(["a", "b", "c"])
    first, second = RuntimeError("a broke"), RuntimeError("b broke")
    latch.fail("a", first)
    latch.fail("b", second)
    assert latch.wait(0)
    assert latch.failed_channel == "a" and latch.error is first
    assert latch.remaining == {"c"}
    with pytest.raises(ValueError):
        latch.count_down("zzz")


def test_batch_latch_wakes_a_waiting_thread():
    """A thread blocked in wait() is released by the last count_down from another thread."""
    latch = BatchLatch([1, 2])
    result = []
    waiter = threading.Thread(target=lambda: result.append(latch.wait(10)), name="latch-waiter")
    waiter.start()
    latch.count_down(1)
    latch.count_down(2)
    waiter.join(10)
    assert result == [True]


@pytest.mark.parametrize("failing", [None, "shop.items"])
def test_batch_latch_with_eof_task_per_channel(make_executor, failing):
    """EOF tasks behind each channel's sends open the latch; a failed send is reported with its channel."""
    ex = make_executor(4, 2)
    channels = ["shop.orders", "shop.items", "crm.users"]
    latch = BatchLatch(channels)
    sent: dict[str, list[int]] = collections.defaultdict(list)

    def send(channel: str, row: int) -> None:
        if channel == failing and row == 3:
            raise ConnectionError(f"{channel} lost its connection")
        sent[channel].append(row)

    for row in range(10):
        for channel in channels:
            ex.submit(send, channel, row, slot=ex.slot_for(channel), callback=latch.on_error(channel))
    for channel in channels:
        ex.submit(lambda ch=channel: sent[ch], slot=ex.slot_for(channel), callback=latch.on_done(channel))
    assert latch.wait(10)
    if failing is None:
        assert latch.error is None
        assert all(sent[ch] == list(range(10)) for ch in channels)
    else:
        assert latch.failed_channel == failing
        assert isinstance(latch.error, ConnectionError)
