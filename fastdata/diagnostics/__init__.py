"""Finding out why training waits: the stall meter (stall.py), named trace ranges
(tracing.py) that the loader marks its stages with, and fastdata-doctor's checks of the
machine and a dataset (doctor_checks.py)."""
