"""The maths, plain Flax: attention, positional encodings, layers, heads, the three
architectures, decoding caches, losses and the teacher-forced scores."""
