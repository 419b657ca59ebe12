"""The site layer: how a site runs jobs on its host (ARCHITECTURE §11).

:mod:`.executor` is the broker's side (start, adopt, stop, and hear the end of jobs by their
launch token), :mod:`.launcher` the long-lived processes that fork jobs, :mod:`.resize` moves a
running malleable job's cores through its control channel (:mod:`.control` reaches it safely),
:mod:`.appstate` checkpoints a job that saves its own state, :mod:`.app_library` gives every job
the application library (:mod:`gbroker.app`) on its path. Back-ends (batch systems), cgroups
and checkpoints belong here.

May import: :mod:`gbroker.app` (the protocol jobs speak), :mod:`gbroker.core`,
:mod:`gbroker.errors`; never the daemon, which drives it.
"""
