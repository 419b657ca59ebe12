""":mod:`gbroker.untrusted.safeyaml`: YAML anchors and aliases are refused before they are built."""

from __future__ import annotations

import pytest

from gbroker.jobs.description import JsdlError
from gbroker.jobs.documents import loads_job_description

# ---------------------------------------------------------------------------------------------
# Attacks on the landed code (issue 9, item 5): each is a precise JsdlError, quickly, and small.

YAML_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_a_yaml_alias_bomb_is_refused_before_it_is_built() -> None:
    assert len(YAML_LAUGHS) < 400
    with pytest.raises(JsdlError) as caught:
        loads_job_description(YAML_LAUGHS, document="bomb.yaml")
    err = caught.value
    assert (err.path, err.expected) == ("line 1, column 4", "YAML without anchors or aliases")
    assert len(str(err)) < 200


@pytest.mark.parametrize(
    "text",
    [
        "executable: &x /bin/true\n",  # an anchor alone
        "executable: /bin/true\narguments: [*x]\n",  # an alias to nothing
        "executable: /bin/true\nenvironment: {<<: *base}\n",  # a merge key
    ],
)
def test_yaml_anchors_and_aliases_are_refused(text: str) -> None:
    with pytest.raises(JsdlError, match="expected YAML without anchors or aliases"):
        loads_job_description(text, fmt="yaml")
