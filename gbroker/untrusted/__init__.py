"""Reading documents nobody vouches for: loaders that refuse what would cost a broker its memory
or its time before anything is built.

:mod:`.safeyaml` is PyYAML's safe loader without anchors and aliases, which job descriptions
(:mod:`gbroker.jobs`) and topologies (:mod:`gbroker.topology`) are both read with. This
``__init__`` imports nothing.

May import: :mod:`gbroker.errors` and libraries; nothing above.
"""
