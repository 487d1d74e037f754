"""The run's vocabulary, the ground floor of `core/`: RunConfig and its techniques, the presets, the child protocol,
the errors a bad value raises and the checks that raise them. Every room above speaks it; it imports none of them."""
