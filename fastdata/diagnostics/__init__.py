"""Finding out why training waits: the stall meter (stall.py), named trace ranges
(tracing.py) that the loader marks its stages with, GPU counters sampled on a thread
(gpu_counters.py: the GPU's and its JPEG engines' busy shares, through NVML), and
fastdata-doctor's checks of the machine and a dataset (doctor_checks.py)."""
