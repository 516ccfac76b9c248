"""The maths, plain Flax: attention, positional encodings, layers, heads, the stacks, the three
architectures, decoding caches, losses and the teacher-forced scores; backend speed paths
(kernels.py) are injected into the layers when a model is built."""
