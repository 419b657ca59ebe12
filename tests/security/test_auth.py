"""Client tokens and peer signatures (gbroker.security.auth), pure."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gbroker.errors import InvalidInput
from gbroker.security.auth import PeerSigner, PeerVerifier, Tokens, Unauthorized, User, same_secret


def test_the_landed_comparison_raised_on_non_ascii() -> None:
    # What the first guard did: a TypeError, hence a 500 for one header.
    with pytest.raises(TypeError):
        hmac.compare_digest("sécret", "secret")


@pytest.mark.parametrize(
    ("presented", "expected", "same"),
    [
        ("secret", "secret", True),
        ("sécret", "secret", False),
        ("sécret", "sécret", True),  # a configured non-ASCII secret works too
        ("", "secret", False),
        (None, "secret", False),
        ("secret\udcff", "secret", False),  # a lone surrogate is just different
        ("Bearer t", "Bearer t", True),
    ],
)
def test_secrets_are_compared_as_utf8_bytes(
    presented: str | None, expected: str, same: bool
) -> None:
    assert same_secret(presented, expected) is same


@given(st.text(), st.text())
def test_any_header_is_a_match_or_not_never_an_error(presented: str, expected: str) -> None:
    assert same_secret(presented, expected) is (presented == expected)


TOKENS = """
# name token [admin]
alice alice-token-0123456789
ops   ops-token-0123456789  admin   # the operator
"""


def test_a_token_file_maps_tokens_to_users() -> None:
    tokens = Tokens.parse(TOKENS, "tokens")
    assert tokens.identify("Bearer alice-token-0123456789") == User("alice")
    assert tokens.identify("Bearer ops-token-0123456789") == User("ops", admin=True)
    for header in (None, "", "Bearer", "Bearer nope-0123456789abc", "Basic alice", "Bearer ä"):
        assert tokens.identify(header) is None
    assert tokens.first_token() == "ops-token-0123456789"  # an admin's, for local clients
    assert User("alice").may_see("alice")
    assert not User("alice").may_see("bob")
    assert User("ops", admin=True).may_see("bob")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("alice short", "tokens:1"),  # under 16 characters
        ("alice alice-token-0123456789 root", "tokens:1"),  # a third word other than admin
        ("a t-0123456789abcdef\na t-0123456789abcdeg", "tokens:2"),  # a name twice
        ("# nothing", "tokens"),
    ],
)
def test_a_bad_token_file_names_its_line(text: str, field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        Tokens.parse(text, "tokens")
    assert error.value.field == field


def test_a_generated_token_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "data" / "tokens"
    token = Tokens.create(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert Tokens.load(path).identify(f"Bearer {token}") == User("admin", admin=True)
    with pytest.raises(FileExistsError):
        Tokens.create(path)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_signed_request_is_accepted_once_from_a_known_site() -> None:
    clock = Clock()
    signer = PeerSigner("b", "fleet secret", clock=clock, nonce=lambda: os.urandom(8).hex())
    verifier = PeerVerifier("fleet secret", {"a", "b"}, "a", clock=clock)
    headers = signer.headers("POST", "/peer/v1/report", b"body", to="a")
    assert verifier.verify("POST", "/peer/v1/report", headers, b"body") == "b"
    with pytest.raises(Unauthorized, match="replayed"):
        verifier.verify("POST", "/peer/v1/report", headers, b"body")
    fresh = signer.headers("POST", "/peer/v1/report", b"body", to="a")
    for method, target, body in (
        ("GET", "/peer/v1/report", b"body"),  # another method
        ("POST", "/peer/v1/kill", b"body"),  # another route
        ("POST", "/peer/v1/report", b"bodY"),  # another body
        ("POST", "/peer/v1/report", None),  # the body left out
    ):
        with pytest.raises(Unauthorized, match="bad signature"):
            verifier.verify(method, target, fresh, body)
    assert verifier.verify("POST", "/peer/v1/report", fresh, b"body") == "b"


def test_stale_foreign_and_unsigned_requests_are_refused() -> None:
    clock = Clock()
    verifier = PeerVerifier("fleet secret", {"a", "b"}, "a", clock=clock)
    old = PeerSigner("b", "fleet secret", clock=lambda: clock.now - 61).headers("GET", "/x", to="a")
    with pytest.raises(Unauthorized, match="60 s off"):
        verifier.verify("GET", "/x", old, b"")
    mars = PeerSigner("Mars", "fleet secret", clock=clock).headers("GET", "/x", to="a")
    with pytest.raises(Unauthorized, match="outside the topology"):
        verifier.verify("GET", "/x", mars, b"")
    wrong = PeerSigner("b", "not the secret", clock=clock).headers("GET", "/x", to="a")
    with pytest.raises(Unauthorized, match="bad signature"):
        verifier.verify("GET", "/x", wrong, b"")
    with pytest.raises(Unauthorized, match="without a site signature"):
        verifier.verify("GET", "/x", {}, b"")
    probe = PeerSigner("b", "fleet secret", clock=clock).headers(
        "POST", "/peer/v1/probe", None, to="a"
    )
    assert verifier.verify("POST", "/peer/v1/probe", probe, None) == "b"  # body not covered


# --- users added and removed while a broker runs (gbroker fleet user) ---------------------------


def test_a_token_file_is_read_again_when_users_come_and_go(tmp_path: Path) -> None:
    from gbroker.security.auth import TokenFile, add_user, remove_user

    path = tmp_path / "tokens"
    admin = Tokens.create(path)
    served = TokenFile(path)
    bob = add_user(path, "bob")
    assert served.identify(f"Bearer {bob}") == User("bob")
    remove_user(path, "bob")
    # A user of the same length in place of bob: the file's size is the same again.
    eve = add_user(path, "eve")
    assert served.identify(f"Bearer {bob}") is None
    assert served.identify(f"Bearer {eve}") == User("eve")
    assert served.identify(f"Bearer {admin}") == User("admin", admin=True)
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_token_file_that_no_longer_reads_leaves_the_users_last_read(tmp_path: Path) -> None:
    from gbroker.security.auth import TokenFile, add_user

    path = tmp_path / "tokens"
    Tokens.create(path)
    alice = add_user(path, "alice")
    served = TokenFile(path)
    path.write_text(path.read_text() + "broken line with four\n")
    assert served.identify(f"Bearer {alice}") == User("alice")


def test_a_signature_is_good_only_at_the_site_it_names() -> None:
    """A request b signed for c, captured and replayed to a, is refused at a (issue 25): the
    receiver is signed, and a is not it. Forging the receiver's header breaks the HMAC."""
    clock = Clock()
    at_a = PeerVerifier("fleet secret", {"a", "b", "c"}, "a", clock=clock)
    at_c = PeerVerifier("fleet secret", {"a", "b", "c"}, "c", clock=clock)
    signer = PeerSigner("b", "fleet secret", clock=clock)
    for_c = signer.headers("POST", "/peer/v1/accept", b"job", to="c")
    with pytest.raises(Unauthorized, match="signed for site 'c', not for a"):
        at_a.verify("POST", "/peer/v1/accept", for_c, b"job")
    with pytest.raises(Unauthorized, match="bad signature"):
        at_a.verify("POST", "/peer/v1/accept", {**for_c, "X-GBroker-To": "a"}, b"job")
    assert at_c.verify("POST", "/peer/v1/accept", for_c, b"job") == "b"


def test_a_peer_of_the_older_scheme_is_told_why_it_is_refused() -> None:
    clock = Clock()
    verifier = PeerVerifier("fleet secret", {"a", "b"}, "a", clock=clock)
    new = PeerSigner("b", "fleet secret", clock=clock).headers("GET", "/x", to="a")
    old = {k: v for k, v in new.items() if k not in ("X-GBroker-To", "X-GBroker-Signature-Version")}
    with pytest.raises(Unauthorized, match=r"signed by scheme '1', not 2 .* an older GBroker"):
        verifier.verify("GET", "/x", old, b"")
