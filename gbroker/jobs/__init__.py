"""Job descriptions: what a user asks for, read, checked and written back.

JSDL 1.0 with its POSIX, SPMD and HPC Profile extensions and GBroker's own, its JSON/YAML
equivalent, parameter sweeps (GFD.149) that make job arrays, and a YAML loader for untrusted
documents. Everything here is pure but for reading a named file: a description becomes a
:class:`~gbroker.jobs.description.JobDescription`, and that becomes the core's
:class:`~gbroker.core.model.Job`.

May import: :mod:`gbroker.core`, :mod:`gbroker.errors` and libraries; nothing above.
"""
