"""InProcessBus: filtering, eager registration, bounded queues with Lagged, close."""

from __future__ import annotations

import asyncio

import pytest

from prospero.core.bus import BusItem, InProcessBus, InProcessSubscription, Lagged
from prospero.core.metrics import BUS_LAGGED, Metrics
from prospero.types.events import FleetEvent, Output, now_ts


def item(agent: str, seq: int, ordinal: int | None = None) -> BusItem:
    return BusItem(
        ordinal if ordinal is not None else seq,
        FleetEvent(seq=seq, ts=now_ts(), repo="ws", agent_id=agent, kind=Output(chunk=str(seq))),
    )


async def drain(sub: InProcessSubscription) -> list[BusItem | Lagged]:
    """Everything already queued, without waiting."""
    out: list[BusItem | Lagged] = []
    while sub.pending():
        out.append(await sub.__anext__())
    return out


async def test_publish_without_subscribers_is_a_noop() -> None:
    bus = InProcessBus()
    for i in range(5000):
        bus.publish(item("a", i + 1))
    assert bus.subscriber_count() == 0


async def test_subscription_registers_eagerly_and_filters_by_key() -> None:
    bus = InProcessBus()
    a = bus.subscribe("a")
    every = bus.subscribe(None)
    bus.publish(item("a", 1))
    bus.publish(item("b", 1))
    bus.publish(item("a", 2))
    got_a = await drain(a)
    got_all = await drain(every)
    assert [(i.event.agent_id, i.event.seq) for i in got_a if isinstance(i, BusItem)] == [
        ("a", 1),
        ("a", 2),
    ]
    assert [(i.event.agent_id, i.event.seq) for i in got_all if isinstance(i, BusItem)] == [
        ("a", 1),
        ("b", 1),
        ("a", 2),
    ]
    a.close()
    every.close()


async def test_repo_stream_key_subscription() -> None:
    bus = InProcessBus()
    sub = bus.subscribe("repo:ws")
    bus.publish(BusItem(1, FleetEvent(seq=1, ts=now_ts(), repo="ws", agent_id="", kind=Output())))
    bus.publish(item("ws", 1))  # an agent whose id happens to equal the repo name
    got = await drain(sub)
    assert len(got) == 1 and isinstance(got[0], BusItem) and got[0].event.agent_id == ""


async def test_waiting_subscriber_is_woken() -> None:
    bus = InProcessBus()
    sub = bus.subscribe("a")
    task = asyncio.create_task(sub.__anext__())
    await asyncio.sleep(0)
    assert not task.done()
    bus.publish(item("a", 7, ordinal=70))
    got = await asyncio.wait_for(task, 5)
    assert isinstance(got, BusItem) and got.ordinal == 70 and got.event.seq == 7


async def test_overflow_drops_then_yields_lagged_once_at_the_hole() -> None:
    metrics = Metrics()
    bus = InProcessBus(buffer=4, metrics=metrics)
    sub = bus.subscribe("a")
    for s in range(1, 11):  # 4 fit, 6 dropped
        bus.publish(item("a", s))
    assert sub.pending() == 5  # 4 items + the Lagged marker
    first = [await sub.__anext__() for _ in range(4)]
    assert [i.event.seq for i in first if isinstance(i, BusItem)] == [1, 2, 3, 4]
    # Nothing newer arrived: the lag is reported as soon as the queue is empty.
    lag = await sub.__anext__()
    assert lag == Lagged(6)
    assert metrics.get(BUS_LAGGED) == 6
    bus.publish(item("a", 11))
    nxt = await sub.__anext__()
    assert isinstance(nxt, BusItem) and nxt.event.seq == 11


async def test_lagged_is_placed_before_newer_items() -> None:
    bus = InProcessBus(buffer=2)
    sub = bus.subscribe(None)
    for s in range(1, 6):  # 1,2 kept; 3,4,5 dropped
        bus.publish(item("a", s))
    assert isinstance(await sub.__anext__(), BusItem)  # seq 1: frees one slot
    bus.publish(item("a", 6))  # the hole is closed by a Lagged marker, then 6
    got = await drain(sub)
    assert [(i.event.seq if isinstance(i, BusItem) else i) for i in got] == [2, Lagged(3), 6]


async def test_memory_is_bounded_per_subscriber() -> None:
    bus = InProcessBus(buffer=8)
    slow = bus.subscribe(None)
    fast = bus.subscribe(None)
    seen = 0
    for s in range(1, 10_001):
        bus.publish(item("a", s))
        assert slow.pending() <= 9  # buffer + one Lagged marker
        got = await fast.__anext__()
        assert isinstance(got, BusItem)
        seen += 1
    assert seen == 10_000
    got = await drain(slow)
    assert [g.event.seq for g in got if isinstance(g, BusItem)] == list(range(1, 9))
    assert got[-1] == Lagged(10_000 - 8)


async def test_close_ends_iteration_and_unregisters() -> None:
    bus = InProcessBus()
    sub = bus.subscribe("a")
    waiter = asyncio.create_task(sub.__anext__())
    await asyncio.sleep(0)
    sub.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 5)
    assert bus.subscriber_count() == 0
    bus.publish(item("a", 1))
    assert sub.pending() == 0
    sub.close()  # idempotent


async def test_async_with_and_async_for() -> None:
    bus = InProcessBus()
    got: list[int] = []
    async with bus.subscribe("a") as sub:
        for s in (1, 2, 3):
            bus.publish(item("a", s))
        async for it in sub:
            assert isinstance(it, BusItem)
            got.append(it.event.seq)
            if it.event.seq == 3:
                break
    assert got == [1, 2, 3]
    assert bus.subscriber_count() == 0


async def test_bus_close_ends_subscriptions_after_draining() -> None:
    bus = InProcessBus()
    sub = bus.subscribe(None)
    bus.publish(item("a", 1))
    bus.close()
    got = [i async for i in sub]
    assert len(got) == 1
    late = bus.subscribe("a")
    assert [i async for i in late] == []


async def test_buffer_must_be_positive() -> None:
    with pytest.raises(ValueError):
        InProcessBus(buffer=0)


async def test_batch_takes_everything_ready_in_order_with_the_lag_at_the_hole() -> None:
    bus = InProcessBus(buffer=3)
    sub = bus.subscribe("a")
    for s in range(1, 6):  # 1..3 kept, 4, 5 dropped
        bus.publish(item("a", s))
    got = list(await sub.batch())
    assert [(i.event.seq if isinstance(i, BusItem) else i) for i in got] == [1, 2, 3, Lagged(2)]
    assert sub.pending() == 0
    # A waiting batch() wakes on the next publish and gets what was published before it ran.
    waiter = asyncio.create_task(sub.batch())
    await asyncio.sleep(0)
    bus.publish(item("a", 6))
    bus.publish(item("a", 7))
    got = list(await asyncio.wait_for(waiter, 5))
    assert [i.event.seq for i in got if isinstance(i, BusItem)] == [6, 7]
    sub.close()
    with pytest.raises(StopAsyncIteration):
        await sub.batch()


async def test_interrupt_makes_a_waiting_batch_return_empty_once() -> None:
    bus = InProcessBus()
    sub = bus.subscribe("a")
    waiter = asyncio.create_task(sub.batch())
    await asyncio.sleep(0)
    sub.interrupt()
    assert list(await asyncio.wait_for(waiter, 5)) == []
    # Queued items win over a pending interrupt, which is reported once the queue is empty.
    sub.interrupt()
    bus.publish(item("a", 1))
    assert [i.event.seq for i in await sub.batch() if isinstance(i, BusItem)] == [1]
    assert list(await sub.batch()) == []
    waiter = asyncio.create_task(sub.batch())
    await asyncio.sleep(0)
    assert not waiter.done()  # the interrupt was consumed
    bus.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 5)


async def test_bus_item_json_is_the_event_json_encoded_once() -> None:
    import orjson

    from prospero.core.bus import event_json
    from prospero.types.events import AgentFinished, ToolStarted

    kinds = [
        Output(chunk="plain"),
        Output(stream="thinking", chunk='q"uote\\ \n\t\u00e9\u2028\U0001f600 \x00 \x1f'),
        Output(chunk=""),
        ToolStarted(id="t1", name="Read", input={"path": "a", "n": 1.5, "deep": [1, None, True]}),
        AgentFinished(outcome="EndOfTurn", turns=2),
    ]
    for i, kind in enumerate(kinds):
        for repo, agent in (("ws", "a"), ("ws", ""), ("", "")):
            ev = FleetEvent(seq=i + 1, ts=now_ts(), repo=repo, agent_id=agent, kind=kind)
            want = orjson.dumps(ev.to_json())
            assert event_json(ev) == want
            it = BusItem(7, ev)
            assert it.json == want and it.json is it.json  # cached
            assert it == BusItem(7, ev)  # the cache is not part of equality
