"""The Loader: its surface (loader.py), the loop that runs ahead on one producer thread
(producer.py), the stages of a batch every decoder plugs into (pipeline.py), the epoch order
(sampler.py), host staging (pinned_ring.py), the CUDA stream handoff (cuda.py) and counters
(stats.py)."""
