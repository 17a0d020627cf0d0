"""Finding out why training waits: the stall meter (stall.py) and named trace ranges
(tracing.py) that the loader marks its stages with."""
