"""Code that runs inside the training process (imports torch and transformers)."""
