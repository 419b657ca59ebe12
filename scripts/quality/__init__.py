"""How good the tests are: mutation testing, planted bugs (docs/RESILIENCE.md); and the cgroup v2
VM that tests run in (``python -m scripts.quality.cgroup2_vm -- COMMAND``).
"""
