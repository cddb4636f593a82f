"""``batchers.gather.TurnGather``: what the models find in one turn of the loop goes out as one send."""

from __future__ import annotations

import asyncio

from batchers.gather import TurnGather


def test_items_added_by_tasks_woken_together_go_out_in_one_send_in_order() -> None:
    async def main() -> tuple[list[list[str]], int]:
        gather: TurnGather[str] = TurnGather()
        sent: list[list[str]] = []
        woken = asyncio.Event()

        async def model(items: list[str]) -> None:
            await woken.wait()
            gather.add(items, sent.append)

        tasks = [asyncio.create_task(model(items)) for items in (["a1", "a2"], [], ["b1"], ["c1"])]
        await asyncio.sleep(0)
        woken.set()  # one fetch's lookups come back together
        await asyncio.gather(*tasks)
        await asyncio.sleep(0)  # the turn after them
        return sent, gather.sends

    sent, sends = asyncio.run(main())
    assert sent == [["a1", "a2", "b1", "c1"]] and sends == 1


def test_items_of_different_turns_are_separate_sends_and_nothing_is_held() -> None:
    async def main() -> list[list[str]]:
        gather: TurnGather[str] = TurnGather()
        sent: list[list[str]] = []
        gather.add(["x"], sent.append)
        await asyncio.sleep(0)
        assert sent == [["x"]]  # out once the turn ended, no timer
        gather.add(["y"], sent.append)
        gather.add(["z"], sent.append)
        await asyncio.sleep(0)
        gather.add([], sent.append)  # nothing to send: no send
        await asyncio.sleep(0)
        return sent

    assert asyncio.run(main()) == [["x"], ["y", "z"]]


def test_the_last_send_given_in_a_turn_sends_everything() -> None:
    async def main() -> tuple[list[str], list[str]]:
        gather: TurnGather[str] = TurnGather()
        first: list[str] = []
        last: list[str] = []
        gather.add(["a"], first.extend)
        gather.add(["b"], last.extend)
        await asyncio.sleep(0)
        return first, last

    assert asyncio.run(main()) == ([], ["a", "b"])
