"""Job descriptions: what a user asks for, read, checked and written back.

JSDL 1.0 with its POSIX, SPMD and HPC Profile extensions and GBroker's own, its JSON/YAML equivalent
(YAML read with :mod:`gbroker.untrusted.safeyaml`), parameter sweeps (GFD.149) that make job arrays,
the OGF schemas a document is validated against (``schema/``, :mod:`.jsdl_schema`), and what a
broker refuses of a job at submission without the network (:mod:`.admission`, staging URLs:
:mod:`.urls`), which ``gbroker jsdl check`` runs offline too. Everything here is pure but for
reading a named file (and the built schemas' cache): a description becomes a
:class:`~gbroker.jobs.description.JobDescription`, and that becomes the core's
:class:`~gbroker.core.model.Job`.

May import: :mod:`gbroker.core`, :mod:`gbroker.untrusted`, :mod:`gbroker.errors` and libraries;
nothing above.
"""
