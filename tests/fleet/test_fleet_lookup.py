"""What `fleet up` says of where client commands find the fleet is what they do: $GBROKER_FLEET,
else the nearest `.gbroker-fleet` walking up if it runs, else the fleet brought up last; a
project's fleet is not found from a directory under it that holds another running one."""

from __future__ import annotations

import os
from pathlib import Path

from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker as run

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello.yaml"


def test_a_nearer_fleet_wins_and_fleet_up_says_so(tmp_path: Path) -> None:
    project = tmp_path / "project"
    inner = project / "inner"
    deeper = inner / "src"
    deeper.mkdir(parents=True)
    save_topology(Topology([SiteSpec("outer", 2)], "full", name="o"), project / "o.yaml")
    save_topology(Topology([SiteSpec("inner", 2)], "full", name="i"), inner / "i.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
    env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]  # the test run's
    up = run("fleet", "up", "--topology", "o.yaml", cwd=project, env=env)
    assert up.returncode == 0, up.stderr
    said = " ".join(up.stdout.split())
    try:
        assert (
            "Client commands use $GBROKER_FLEET if set, else the nearest .gbroker-fleet walking "
            "up from their directory if it runs, else the most recent fleet you brought up that "
            "still runs."
        ) in said
        assert (
            f"They find this one from {project} and the directories under it (but where another "
            "running .gbroker-fleet is nearer), and from anywhere while it is that one, or with "
            f"GBROKER_FLEET={project / '.gbroker-fleet'}"
        ) in said
        # (Without --dir, up under the project would find the project's fleet directory.)
        inner_up = run(
            "fleet", "up", "--topology", "i.yaml", "--dir", ".gbroker-fleet", cwd=inner, env=env
        )
        assert inner_up.returncode == 0, inner_up.stderr
        try:
            # Under the inner fleet's directory: the inner fleet, though under the project.
            assert run("submit", str(HELLO), cwd=deeper, env=env).stdout.startswith("inner.")
            # At the project's root: its own fleet, though the inner one came up last.
            assert run("submit", str(HELLO), cwd=project, env=env).stdout.startswith("outer.")
            # Elsewhere: the fleet brought up last; $GBROKER_FLEET before anything.
            assert run("submit", str(HELLO), cwd=tmp_path, env=env).stdout.startswith("inner.")
            named = {**env, "GBROKER_FLEET": str(project / ".gbroker-fleet")}
            assert run("submit", str(HELLO), cwd=deeper, env=named).stdout.startswith("outer.")
        finally:
            assert run("fleet", "down", cwd=inner, env=env).returncode == 0
    finally:
        assert run("fleet", "down", cwd=project, env=env).returncode == 0
