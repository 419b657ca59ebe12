"""gbroker.app.malleable's messages: checked where they enter, on either side of the channel."""

from __future__ import annotations

import pytest

from gbroker.app.malleable import Channel, ChannelError, decode, encode


def test_messages_are_checked_where_they_enter() -> None:
    assert decode(encode({"op": "accept", "id": 3, "cores": 2})) == {
        "op": "accept", "id": 3, "cores": 2,
    }  # fmt: skip
    for bad, why in [
        (b"not json\n", "not JSON"),
        (b"[1]\n", "expected a JSON object"),
        (b'{"op": "move"}\n', "op: expected allocation, offer, accept or request"),
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
