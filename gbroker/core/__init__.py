"""The sans-I/O core: pure decisions, shared by the broker daemon and the simulator.

Nothing in this package reads a clock, touches a socket or a file, or draws global randomness.
Callers pass ``now`` and events in and carry out the commands that come back: every event and
command is in one catalogue, :mod:`.events` (read it first). Here live the job and
site model (:mod:`.model`, :mod:`.names`), the job state machine (:mod:`.states`), F(j)
(:mod:`.ranking`), what a site offers a job (:mod:`.requirements`), the owner's dispatch algorithms
and the site agent (:mod:`.dispatch`, :mod:`.site`), GridWay 5.6.1 as a baseline (:mod:`.gridway`),
KOALA's placement of co-allocated jobs (:mod:`.coalloc`), the AppLeS planner (:mod:`.apples`), the
local scheduler and its malleability policies (:mod:`.localsched`, :mod:`.malleable`,
:mod:`.sdpolicy`), liveness and black-hole health (:mod:`.liveness`, :mod:`.health`), what is
left of a moved job's limits (:mod:`.limits`), job arrays and the paper's metrics.

May import: :mod:`gbroker.errors` and the standard library only.

Import from the modules themselves: this ``__init__`` imports nothing, so that a small module
(:mod:`.names`, which the command line's client commands use to check job ids before any
request) is loaded without the whole core.
"""
