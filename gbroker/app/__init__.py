"""What a job imports: the application's side of GBroker.

:mod:`.malleable` is the resize protocol's application end (hear the site's offers, answer them,
ask for cores). A site gives every job this package (``GBROKER_APP_PATH``), so a job's program
needs nothing installed. Standard library only: it runs under whatever Python a site's jobs use.

May import: the standard library only.
"""
