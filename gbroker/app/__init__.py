"""What a job imports: the application's side of GBroker.

:mod:`.malleable` is the resize protocol's application end (hear the site's offers, answer them,
ask for cores). A site gives every job this package: a read-only copy of it, and nothing else of
the broker, in the directory that ``GBROKER_APP_PATH`` names in the job's environment, which is
last on the job's ``PYTHONPATH`` (:mod:`gbroker.site.app_library`); so a job's program needs
nothing installed, and a job's own copy comes first. Standard library only: it runs under
whatever Python a site's jobs use.

May import: the standard library only.
"""
