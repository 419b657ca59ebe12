"""The papers' experiments and figures, on the simulator and on real fleets (docs/EXPERIMENTS.md),
and the peers they are compared with.

Run each from the checkout's root: ``python -m scripts.experiments.exp_koala --seeds 10``.
"""
