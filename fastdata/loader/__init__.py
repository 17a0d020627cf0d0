"""The Loader: sampler -> source -> decode into a pinned slot -> CUDA handoff, on one
producer thread per loader (loader.py), with its epoch order (sampler.py), host staging
(pinned_ring.py), stream handoff (cuda.py) and counters (stats.py)."""
