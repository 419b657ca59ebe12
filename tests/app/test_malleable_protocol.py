"""gbroker.app.malleable's messages: checked where they enter, on either side of the channel.

And the job's side of a real channel (a Unix socket in a temporary directory), the test playing
the site with plain connections: several connections at once, checkpoints asked, refused,
taken at a safe point, resumed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gbroker.app.malleable import Channel, ChannelError, Offer, decode, encode


def test_messages_are_checked_where_they_enter() -> None:
    assert decode(encode({"op": "accept", "id": 3, "cores": 2})) == {
        "op": "accept", "id": 3, "cores": 2,
    }  # fmt: skip
    for bad, why in [
        (b"not json\n", "not JSON"),
        (b"[1]\n", "expected a JSON object"),
        (b'{"op": "move"}\n', "op: expected allocation, offer, accept, request, hello"),
        (b'{"op": "hello", "checkpoint": 1}\n', "checkpoint: expected true or false"),
        (b'{"op": "checkpoint", "id": 1, "path": "state"}\n', "path: expected an absolute"),
        (b'{"op": "checkpoint", "id": 1, "path": "/a/"}\n', "path: expected the path of a file"),
        (b'{"op": "checkpointed", "id": 1, "bytes": -1}\n', "bytes: expected a size"),
        (b'{"op": "refused", "id": 1}\n', "reason: expected a string"),
        (b'{"op": "resume"}\n', "id: expected a count"),
        (b'{"op": "accept", "id": 1, "cores": -1}\n', "cores: expected a count of cores"),
        (b'{"op": "accept", "id": 1, "cores": true}\n', "cores: expected a count of cores"),
        (b'{"op": "allocation", "cores": 1, "cpus": ["0"]}\n', "cpus: expected a list"),
        (
            b'{"op": "offer", "id": 1, "cores": 2, "old": 1, "cpus": [0], "deadline": 0, '
            b'"mandatory": false}\n',
            "deadline: expected seconds",
        ),
        (b"x" * 5000, "a message of over 4096 bytes"),
    ]:
        with pytest.raises(ChannelError, match=why):
            decode(bad)


def test_a_channel_needs_its_variable() -> None:
    with pytest.raises(ChannelError, match="GBROKER_CONTROL is not set"):
        Channel(path="")


class Site:
    """One connection of the test, as the site, to a Channel's socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: Path) -> Site:
        return cls(*await asyncio.open_unix_connection(str(path)))

    def send(self, message: dict[str, Any]) -> None:
        self.writer.write(encode(message))

    async def heard(self) -> dict[str, Any]:
        return decode(await self.reader.readline())

    def close(self) -> None:
        self.writer.close()


@pytest.mark.asyncio
async def test_a_second_connection_does_not_cut_the_first(tmp_path: Path) -> None:
    """The resize link and a checkpoint request are open at once: before, each new connection
    closed the one before, so the site's resize link and a checkpoint request cut each other."""
    async with asyncio.timeout(20), Channel(str(tmp_path / "c")) as channel:
        link = await Site.connect(tmp_path / "c")
        assert await link.heard() == {"op": "hello", "checkpoint": False, "held": None}
        link.send({"op": "allocation", "cores": 1, "cpus": [0]})
        await channel.next()
        other = await Site.connect(tmp_path / "c")
        assert (await other.heard())["op"] == "hello"
        link.send(
            {"op": "offer", "id": 4, "cores": 2, "cpus": [0, 1], "old": 1, "deadline": 5,
             "mandatory": False}
        )  # fmt: skip
        offer = await channel.next()
        assert isinstance(offer, Offer)
        await channel.accept(offer)
        assert await link.heard() == {"op": "accept", "id": 4, "cores": 2}  # on the link
        other.send({"op": "checkpoint", "id": 9, "path": str(tmp_path / "s")})
        refused = await other.heard()  # no hook: refused, on the connection that asked
        assert refused["op"] == "refused"
        assert "no on_checkpoint hook" in refused["reason"]
        link.close()
        other.close()


@pytest.mark.asyncio
async def test_a_checkpoint_is_taken_at_a_safe_point_and_holds_until_resumed(
    tmp_path: Path,
) -> None:
    progress = [0]

    def save() -> bytes:
        return json.dumps(progress[0]).encode()

    async with asyncio.timeout(20), Channel(str(tmp_path / "c"), on_checkpoint=save) as channel:
        site = await Site.connect(tmp_path / "c")
        assert await site.heard() == {"op": "hello", "checkpoint": True, "held": None}

        async def work() -> None:
            while progress[0] < 1000:
                await channel.safe_point()
                progress[0] += 1
                await asyncio.sleep(0)

        worker = asyncio.ensure_future(work())
        site.send({"op": "checkpoint", "id": 3, "path": str(tmp_path / "state")})
        answer = await site.heard()
        state = (tmp_path / "state").read_bytes()
        assert answer == {"op": "checkpointed", "id": 3, "bytes": len(state)}
        stopped_at = json.loads(state)
        assert progress[0] == stopped_at
        later = await Site.connect(tmp_path / "c")  # a restarted site learns it is stopped
        assert await later.heard() == {"op": "hello", "checkpoint": True, "held": 3}
        assert progress[0] == stopped_at
        assert not worker.done()
        later.send({"op": "resume", "id": 2})  # not the checkpoint it is stopped at
        assert (await later.heard())["reason"] == "stopped at checkpoint 3, not 2"
        later.send({"op": "resume", "id": 3})
        assert await later.heard() == {"op": "resumed", "id": 3}
        await worker
        assert progress[0] == 1000
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "state"]  # no temporary left
        site.close()
        later.close()


@pytest.mark.asyncio
async def test_a_hook_that_fails_is_a_refusal_and_the_job_goes_on(tmp_path: Path) -> None:
    def broken() -> bytes:
        raise RuntimeError("disk full of ideas")

    async with asyncio.timeout(20), Channel(str(tmp_path / "c"), on_checkpoint=broken) as channel:
        site = await Site.connect(tmp_path / "c")
        await site.heard()
        site.send({"op": "checkpoint", "id": 1, "path": str(tmp_path / "state")})
        while not channel.checkpoint_wanted:
            await asyncio.sleep(0.01)
        await channel.safe_point()  # returns: nothing was saved, so nothing holds it
        answer = await site.heard()
        assert answer["op"] == "refused"
        assert answer["reason"] == "the checkpoint failed: RuntimeError: disk full of ideas"
        assert not (tmp_path / "state").exists()
        site.close()


@pytest.mark.asyncio
async def test_a_site_line_over_the_limit_closes_that_connection_only(tmp_path: Path) -> None:
    async with asyncio.timeout(20), Channel(str(tmp_path / "c")) as channel:
        good = await Site.connect(tmp_path / "c")
        await good.heard()
        bad = await Site.connect(tmp_path / "c")
        await bad.heard()
        bad.writer.write(b"x" * 100_000 + b"\n")
        assert await bad.reader.read() == b""  # closed by the job
        good.send({"op": "allocation", "cores": 2, "cpus": [0, 1]})
        assert (await channel.next()) is not None
        good.close()
