"""``batchers.lookups.SharedLookups``: the lookups asked for in one turn of the loop share one MGET."""

from __future__ import annotations

import asyncio

import pytest

from batchers.lookups import LookupAbandoned, SharedLookups


class FakeRedis:
    def __init__(self, data: dict[str, bytes], fail: Exception | None = None) -> None:
        self.data, self.fail = data, fail
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()
        self.hold = False

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        self.calls.append(list(keys))
        if self.hold:
            await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [self.data.get(k) for k in keys]


def test_lookups_woken_together_go_out_as_one_mget_and_each_gets_its_own_values() -> None:
    async def main() -> tuple[list[list[bytes | None]], list[list[str]], int]:
        redis = FakeRedis({"a": b"1", "c": b"3", "e": b"5"})
        lookups = SharedLookups(redis.mget)
        woken = asyncio.Event()

        async def model(keys: list[str]) -> list[bytes | None]:
            await woken.wait()
            return await lookups(keys)

        tasks = [asyncio.create_task(model(ks)) for ks in (["a", "b"], ["c"], [], ["d", "e", "a"])]
        await asyncio.sleep(0)
        woken.set()  # one fetch wakes every model's lookup task at once
        got = await asyncio.gather(*tasks)
        return got, redis.calls, lookups.round_trips

    got, calls, trips = asyncio.run(main())
    assert got == [[b"1", None], [b"3"], [], [None, b"5", b"1"]]
    assert calls == [["a", "b", "c", "d", "e", "a"]] and trips == 1


def test_lookups_in_different_turns_are_separate_round_trips() -> None:
    async def main() -> list[list[str]]:
        redis = FakeRedis({"a": b"1"})
        lookups = SharedLookups(redis.mget)
        assert await lookups(["a"]) == [b"1"]
        assert await lookups(["b"]) == [None]
        return redis.calls

    assert asyncio.run(main()) == [["a"], ["b"]]


def test_an_error_of_the_shared_mget_reaches_every_asker() -> None:
    async def main() -> list[BaseException | list[bytes | None]]:
        lookups = SharedLookups(FakeRedis({}, fail=ConnectionError("redis is away")).mget)
        return await asyncio.gather(lookups(["a"]), lookups(["b"]), return_exceptions=True)

    got = asyncio.run(main())
    assert all(isinstance(r, ConnectionError) and "away" in str(r) for r in got)


@pytest.mark.parametrize("while_", ["gathering", "waiting for the reply"])
def test_a_cancelled_sender_fails_the_others_rather_than_leave_them_waiting(while_: str) -> None:
    async def main() -> tuple[BaseException | list[bytes | None], list[list[str]]]:
        redis = FakeRedis({"b": b"2"})
        redis.hold = True
        lookups = SharedLookups(redis.mget)
        woken = asyncio.Event()

        async def model(keys: list[str]) -> list[bytes | None]:
            await woken.wait()
            return await lookups(keys)

        sender, joiner = asyncio.create_task(model(["a"])), asyncio.create_task(model(["b"]))
        await asyncio.sleep(0)
        woken.set()
        await asyncio.sleep(0)  # the sender has begun gathering and the joiner has joined
        if while_ == "waiting for the reply":
            while not redis.calls:
                await asyncio.sleep(0)
        sender.cancel()
        (result,) = await asyncio.wait_for(asyncio.gather(joiner, return_exceptions=True), 5)
        assert sender.cancelled()
        return result, redis.calls

    result, calls = asyncio.run(main())
    assert isinstance(result, LookupAbandoned)
    assert calls == ([] if while_ == "gathering" else [["a", "b"]])
