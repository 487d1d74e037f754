"""The bytes model's per-band formulas: what precision decides, the weights' copies, the optimizer's states, and
the activations and temporaries, each from a model's shapes (`core/memory/shapes.py`) and the run's config."""
