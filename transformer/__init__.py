"""A JAX/Flax transformer research library: build, train, decode and inspect transformers."""
